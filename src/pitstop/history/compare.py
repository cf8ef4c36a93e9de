"""Comparing stored runs and catching regressions. Pure functions, apart from finding a baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

from pitstop.history.documents import METRIC_COLUMNS, STORED_FIGURES, stored_figures
from pitstop.history.errors import HistoryError
from pitstop.history.store import HistoryStore, RunRecord

if TYPE_CHECKING:
    from pitstop.core.findings import Finding
    from pitstop.diagnose.causes.library_upgrade import PhaseDelta, VersionChange

METRIC_NAMES = {
    "real_tokens_per_s": "real tokens/s",
    "tokens_per_s": "tokens/s",
    "step_time_s": "step time",
    "mfu": "MFU",
    "joules_per_real_token": "energy per real token",
    "cost_per_million_real_tokens": "cost per million real tokens",
}
LOWER_IS_BETTER = frozenset({"step_time_s", *STORED_FIGURES})
WORDS = {  # how a drop and a gain read for the figures that are not speeds (the drop is in their inverse)
    "joules_per_real_token": ("fewer real tokens per joule", "more real tokens per joule"),
    "cost_per_million_real_tokens": (
        "fewer real tokens per unit of money",
        "more real tokens per unit of money",
    ),
}
CHECKED = (*METRIC_COLUMNS, *STORED_FIGURES)  # what `history check` gates on
BANDED = "real_tokens_per_s"  # the metric whose spread each run measured (throughput_spread): it gets a band


def parse_max_drop(text: str) -> float:
    """``"5%"`` or ``"0.05"`` → 0.05. A bare number above 1 is refused: ``5`` could mean 5% or 500%."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise HistoryError(f"--max-drop '{text}' is not a percentage (e.g. 5% or 0.05)") from None
    if not math.isfinite(value) or not 0 <= value < 1:
        raise HistoryError(f"--max-drop '{text}' must be between 0% and 100% (e.g. 5% or 0.05)")
    return value


def format_metric(name: str, value: float | None) -> str:
    if value is None:
        return "–"
    if name == "mfu":
        return f"{value:.1%}"
    if name == "step_time_s":
        return f"{value:.3g} s"
    if name == "joules_per_real_token":
        return f"{value:.3g} J"
    if name == "cost_per_million_real_tokens":
        return f"${value:,.4g}"
    return f"{value:,.0f}"


def flatten(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"versions": {"torch": "2.5"}}`` → ``{"versions.torch": "2.5"}``."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fingerprint fields whose values differ, as ``{field: (a, b)}`` (a missing field is ``None``)."""
    flat_a, flat_b = flatten(a), flatten(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return {k: (flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)}


@dataclass
class MetricRow:
    """One metric of two runs. ``band_a`` / ``band_b``: each run's noise band, as a fraction of its value
    (NOISE_ERRORS standard errors of its measured spread); ``None`` where the run measured none or the metric
    has no spread of its own."""

    name: str
    a: float | None
    b: float | None
    band_a: float | None = None
    band_b: float | None = None

    @property
    def ratio(self) -> float | None:
        """B / A, or ``None`` where either is unknown or A is zero."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    @property
    def band(self) -> float | None:
        """The ratio's noise band as a fraction of it: both runs' bands in quadrature (the two rates'
        relative errors add so in their ratio); ``None`` unless both runs have one."""
        if self.band_a is None or self.band_b is None:
            return None
        return math.hypot(self.band_a, self.band_b)

    @property
    def ratio_range(self) -> tuple[float, float] | None:
        """The ratio's band, low to high."""
        ratio, band = self.ratio, self.band
        if ratio is None or band is None:
            return None
        return ratio * max(0.0, 1 - band), ratio * (1 + band)

    @property
    def within_noise(self) -> bool | None:
        """True when the band covers ×1: the two runs do not differ measurably; ``None`` without a band."""
        span = self.ratio_range
        return None if span is None else span[0] <= 1.0 <= span[1]

    def ratio_text(self) -> str:
        """``×0.86``, and where both runs measured their noise ``×0.86 ±16.2% (within noise)``."""
        ratio = self.ratio
        if ratio is None:
            return "–"
        if self.band is None:
            return f"×{ratio:.2f}"
        return f"×{ratio:.2f} ±{self.band:.1%} ({'within noise' if self.within_noise else 'beyond noise'})"

    def value_text(self, which: str) -> str:
        """Run A's or B's value, with its own band where it measured one (``41,200 ±3.4%``)."""
        value, band = (self.a, self.band_a) if which == "a" else (self.b, self.band_b)
        text = format_metric(self.name, value)
        return text if band is None or value is None else f"{text} ±{band:.1%}"

    def noise_line(self, a_id: int, b_id: int) -> str | None:
        """One sentence for the reader: both bands, the ratio's, and whether it covers ×1; None without bands."""
        name = METRIC_NAMES.get(self.name, self.name)
        span, ratio = self.ratio_range, self.ratio
        if ratio is not None and self.name == BANDED and span is None:
            unmeasured = [f"#{i}" for i, band in ((a_id, self.band_a), (b_id, self.band_b)) if band is None]
            return (
                f"{name}: B/A ×{ratio:.2f} without a noise band: run {' and '.join(unmeasured)} measured no spread "
                "of its throughput (too few steps); a ratio this close to ×1 may be noise"
                if abs(ratio - 1) < 0.25
                else None
            )
        if span is None or self.band_a is None or self.band_b is None:
            return None
        from pitstop.diagnose.causes.library_upgrade import NOISE_ERRORS

        head = (
            f"{name}: B/A ×{ratio:.2f}, noise band ×{span[0]:.2f}–×{span[1]:.2f} "
            f"(run #{a_id} ±{self.band_a:.1%}, run #{b_id} ±{self.band_b:.1%}: {NOISE_ERRORS:g} standard "
            "errors of each run's measured spread)"
        )
        if self.within_noise:
            return f"{head}: within noise, the runs do not differ measurably"
        return f"{head}: beyond noise, a measured change"


def value_of(record: RunRecord, metric: str) -> float | None:
    """An indexed metric, or a figure read from the stored document (energy, cost per real token)."""
    if metric in STORED_FIGURES:
        return stored_figures(record.result).get(metric)
    return record.metric(metric)


def spread_of(record: RunRecord) -> float | None:
    """The run's measured spread: the relative standard error of its real tokens/s (None if not measured)."""
    metrics = (record.result or {}).get("metrics") or {}
    spread = metrics.get("throughput_spread") if isinstance(metrics, dict) else None
    return (
        float(spread) if isinstance(spread, int | float) and math.isfinite(spread) and spread >= 0 else None
    )


def noise_band(record: RunRecord) -> float | None:
    """The run's noise band on real tokens/s, as a fraction: NOISE_ERRORS standard errors of its spread."""
    from pitstop.diagnose.causes.library_upgrade import NOISE_ERRORS  # the same band as library_upgrade's

    spread = spread_of(record)
    return None if spread is None else NOISE_ERRORS * spread


def metric_rows(a: RunRecord, b: RunRecord) -> list[MetricRow]:
    """The indexed metrics, then the energy and cost per real token where either run's document has them
    (records loaded with their document; a GPU run with a power reading, a price for the cost). Real
    tokens/s carries each run's noise band (the spread each run measured is that rate's)."""
    bands = (noise_band(a), noise_band(b))
    rows = [
        MetricRow(name, a.metric(name), b.metric(name), *(bands if name == BANDED else (None, None)))
        for name in METRIC_COLUMNS
    ]
    figures_a, figures_b = stored_figures(a.result), stored_figures(b.result)
    rows += [
        MetricRow(name, figures_a.get(name), figures_b.get(name))
        for name in STORED_FIGURES
        if name in figures_a or name in figures_b
    ]
    return rows


@dataclass
class Comparison:
    """Two stored runs side by side: their metrics (B / A), the setup fields that differ, the library versions
    that changed, each phase's time per step, and library_upgrade's finding when B is slower beyond the noise
    with other versions. Displays itself as a table in a notebook."""

    a: RunRecord
    b: RunRecord
    rows: list[MetricRow] = field(default_factory=list)
    differ: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    versions: list[VersionChange] = field(default_factory=list)
    phases: list[PhaseDelta] = field(default_factory=list)
    finding: Finding | None = None

    def noise_lines(self) -> list[str]:
        """What each banded metric's noise says (real tokens/s): the bands and whether the ratio is within."""
        lines = [row.noise_line(self.a.id, self.b.id) for row in self.rows]
        return [line for line in lines if line]

    def _repr_html_(self) -> str:
        from pitstop.history.display import html_table

        rows = [
            [METRIC_NAMES.get(r.name, r.name), r.value_text("a"), r.value_text("b"), r.ratio_text()]
            for r in self.rows
        ]
        head = [
            "metric",
            f"run #{self.a.id} ({self.a.label or self.a.kind})",
            f"run #{self.b.id} ({self.b.label or self.b.kind})",
            "B / A",
        ]
        out = html_table(head, rows, caption=f"pitstop history: run #{self.a.id} vs run #{self.b.id}")
        out += "".join(f"<p>{escape(line)}</p>" for line in self.noise_lines())
        if self.differ:
            setup = [[k, a, b] for k, (a, b) in self.differ.items()]
            out += html_table(["setup field that differs", "A", "B"], setup, right_from=3)
        else:
            out += "<p>Same setup (fingerprint): the runs are comparable.</p>"
        if self.versions:
            changed = [[c.package, c.old, c.new] for c in self.versions]
            out += html_table(["library version that changed", "A", "B"], changed, right_from=3)
        if self.phases:
            phases = [[d.phase.label, f"{d.before_s * 1000:,.1f} ms", f"{d.after_s * 1000:,.1f} ms",
                       f"{d.delta_s * 1000:+,.1f} ms"] for d in self.phases]  # fmt: skip
            out += html_table(["phase (per step)", "A", "B", "B − A"], phases)
        if self.finding is not None:
            out += f"<p><b>{escape(self.finding.title)}</b>: {escape(self.finding.summary)}</p>"
        return out


def compare_runs(a: RunRecord, b: RunRecord) -> Comparison:
    """What ``pitstop history compare A B`` shows, as an object (a table in notebooks). Both records are
    loaded with their documents (``store.get``) for the versions and phases."""
    from pitstop.history.upgrade import phase_changes_of, upgrade_finding, version_changes_of

    return Comparison(
        a,
        b,
        metric_rows(a, b),
        fingerprint_diff(a.fingerprint_fields, b.fingerprint_fields),
        version_changes_of(a, b),
        phase_changes_of(a, b),
        upgrade_finding(b, a),
    )


def slowdown(baseline: float, value: float, metric: str) -> float:
    """How much slower ``value`` is than ``baseline``, as a fraction of the baseline's speed (< 0: faster).

    For a time (lower is better) the drop is in the matching speed, 1 / time, so ``--max-drop`` means the
    same for every metric.
    """
    if metric in LOWER_IS_BETTER:
        return 1.0 - baseline / value
    return 1.0 - value / baseline


@dataclass
class Verdict:
    """The outcome of ``check``: a regression when the drop exceeds what is allowed."""

    run: RunRecord
    baseline: RunRecord
    metric: str
    drop: float
    max_drop: float
    noise: float | None = None  # the smallest drop the two runs' own spreads resolve (two standard errors)

    @property
    def regression(self) -> bool:
        return self.drop > self.max_drop

    @property
    def undecided(self) -> bool:
        """The runs' own noise is larger than the drop allowed: a result within it proves nothing."""
        return self.noise is not None and self.noise > self.max_drop and self.drop <= self.max_drop

    def message(self) -> str:
        name = METRIC_NAMES.get(self.metric, self.metric)
        label = f" ({self.baseline.label})" if self.baseline.label else ""
        worse, better = WORDS.get(self.metric, ("slower", "faster"))
        if abs(self.drop) < 0.0005:
            way = "the same" if self.metric in WORDS else "the same speed"
        else:
            way = f"{self.drop:.1%} {worse}" if self.drop > 0 else f"{-self.drop:.1%} {better}"
        verdict = "more than" if self.regression else "within"
        text = (
            f"run #{self.run.id}: {name} {format_metric(self.metric, value_of(self.run, self.metric))} vs "
            f"{format_metric(self.metric, value_of(self.baseline, self.metric))} in baseline run "
            f"#{self.baseline.id}{label}: {way}, {verdict} the {self.max_drop:.0%} allowed"
        )
        if self.noise is not None and self.noise > self.max_drop:
            text += f", but the two runs' own noise only resolves a change of {self.noise:.0%}: " + (
                "rerun both longer (--steps) to confirm it"
                if self.regression
                else f"it cannot tell a drop of {self.max_drop:.0%} from noise; rerun both longer (--steps)"
            )
        return text


def resolvable_drop(run: RunRecord, baseline: RunRecord) -> float | None:
    """Two standard errors of the difference of the runs' rates, from each run's measured spread (the
    relative standard error of its real tokens/s); None when either run did not measure one."""
    from pitstop.diagnose.causes.library_upgrade import resolvable_drop as drop_resolved

    return drop_resolved(spread_of(run), spread_of(baseline))


def check(run: RunRecord, baseline: RunRecord, metric: str, max_drop: float) -> Verdict:
    """Compare ``run`` with ``baseline`` on ``metric``; raises when either lacks it."""
    if metric not in CHECKED:
        raise HistoryError(f"unknown metric '{metric}'; known: {', '.join(CHECKED)}")
    if run.id == baseline.id:
        raise HistoryError(f"run #{run.id} cannot be its own baseline")
    value, base = value_of(run, metric), value_of(baseline, metric)
    for record, v in ((run, value), (baseline, base)):
        if v is None or v <= 0:
            raise HistoryError(f"run #{record.id} has no {METRIC_NAMES[metric]} to compare")
    assert value is not None and base is not None
    return Verdict(
        run, baseline, metric, slowdown(base, value, metric), max_drop, resolvable_drop(run, baseline)
    )


def find_baseline(store: HistoryStore, run: RunRecord, baseline: str) -> RunRecord:
    """``baseline`` as a run id, else the newest run of that label with the same fingerprint and kind.

    The kind must match too: a tune result (with its fixes applied) is no baseline for a doctor run.
    """
    label = baseline.strip()
    run_id = label.removeprefix("#")
    if run_id.isdigit():
        found = store.get(int(run_id))
        if found is not None:
            return found
    found = store.latest(kind=run.kind, label=label, fingerprint=run.fingerprint, exclude=run.id)
    if found is not None:
        return found
    also = f"no run #{run_id}, and " if run_id.isdigit() else ""
    raise HistoryError(
        f"{also}no {run.kind} run labelled '{label}' with fingerprint {run.fingerprint} "
        f"(the setup of run #{run.id}) in {store.path}"
    )
