"""Every versioned document id pitstop writes, in one place. An id names a form that readers accept forever."""

from __future__ import annotations

from typing import Final

RUN: Final = "pitstop.run/1"  # a diagnosis: findings, metrics, environment, per-rank results, the profile
# the keys ``checks`` adds to a run (what each cause stood on): {"evidence": [{kind, present, detail}],
# "checked": [cause], "not_checked": [{cause, why}]}; a reader that finds none recomputes it from the profile
RUN_CHECKS_KEYS: Final = ("evidence", "checked", "not_checked")
PROFILE: Final = "pitstop.profile/1"  # a RunProfile alone (what was measured)
TUNE: Final = "pitstop.tune/1"  # a tune session: trials, verdict, the changes to keep
PLAN: Final = "pitstop.plan/1"  # a memory / throughput plan
HISTORY: Final = "pitstop.history/1"  # runs from the history side by side (`history compare --json`)
DATA_STATS: Final = "pitstop.data.stats/1"  # a dataset's padding figures (`data stats --json`)
DATA_PACK: Final = "pitstop.data.pack/1"  # a packing plan, bins included (`data pack --json`)
HISTORY_DB_VERSION: Final = 1  # the SQLite history's user_version
