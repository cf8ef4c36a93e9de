"""The plain-loop API: observe the optimizer steps run inside a ``with`` block.

import pitstop
with pitstop.watch(steps=50, warmup=10, json_path="run.json"):
    for batch in loader:
        loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pitstop.integrations.session import Session


@contextmanager
def watch(
    steps: int | None = 50,
    warmup: int = 10,
    json_path: str | Path | None = None,
    report: bool = True,
    live: bool | None = None,
) -> Iterator[Session]:
    """Measure ``steps`` optimizer steps after ``warmup``; the diagnosis is printed when they are done
    (or when the block ends) and is kept on the returned session as ``.diagnosis``. ``live``: show the
    watch's panel meanwhile (None: in a Jupyter kernel only, as a display updated in place)."""
    session = Session(
        steps=steps, warmup=warmup, json_path=json_path, report=report, source="watch", live=live
    ).start()
    try:
        yield session
    finally:
        session.stop()
