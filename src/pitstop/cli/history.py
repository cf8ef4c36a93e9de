"""``pitstop history``: list, show and compare stored runs; ``check`` fails a CI job on a regression."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pitstop import schemas
from pitstop.cli.errors import UserError
from pitstop.history import HistoryError, HistoryStore, RunRecord, open_store
from pitstop.report.untrusted import as_text, shown

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from pitstop.core.findings import Finding
    from pitstop.history.compare import Comparison

history_app = typer.Typer(
    help="Every measured result, kept in SQLite: list, show, compare runs and catch regressions.",
    no_args_is_help=True,
)

HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="The history file (default: $PITSTOP_HISTORY, else this project's: "
        "pitstop/history/<git root's name>-<hash>.sqlite3 in the user data folder).",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"pitstop: {shown(message)}", err=True, fg="red")
    return typer.Exit(code)


@contextmanager
def _store(path: Path | None) -> Iterator[HistoryStore]:
    """The history, opened for reading; its errors become one line and exit code 2."""
    try:
        with open_store(path, create=False) as store:
            yield store
    except (HistoryError, UserError) as exc:
        raise _fail(str(exc), getattr(exc, "code", 2)) from None


def _require(store: HistoryStore, run_id: int) -> RunRecord:
    found = store.get(run_id)
    if found is None:
        raise HistoryError(f"no run #{run_id} in {store.path}{_legacy_hint(store.path)}")
    return found


def _legacy_hint(path: Path) -> str:
    """Where runs recorded before per-project histories are, when this is a project's default history and
    the old shared file exists (read with --history; nothing is moved or rewritten)."""
    from pitstop.history.paths import legacy_path, project_path

    try:
        legacy = legacy_path()
        if path != project_path() or not legacy.is_file():
            return ""
    except (HistoryError, OSError):
        return ""
    return f" (runs recorded before histories were kept per project: --history {legacy})"


def _when(created_at: str, short: bool = False) -> str:
    """Local time; ``short`` drops the year (for the list, where width is dear)."""
    try:
        local = datetime.fromisoformat(created_at).astimezone()
        return local.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M")
    except ValueError:
        return created_at


def _short(text: str | None, width: int = 40) -> str:
    if not text:
        return "–"
    return text if len(text) <= width else text[: width - 1] + "…"


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


@history_app.command("list")
def list_runs(
    limit: Annotated[int, typer.Option(min=1, help="How many runs, newest first.")] = 20,
    kind: Annotated[str | None, typer.Option(help="Only this kind: doctor, tune, analyze, demo…")] = None,
    label: Annotated[str | None, typer.Option(help="Only runs with this label.")] = None,
    json_out: JsonFlag = False,
    history: HistoryOpt = None,
    all_projects: Annotated[
        bool,
        typer.Option(
            "--all-projects",
            help="Every project's history file (and the one all projects shared before): runs, newest, path.",
        ),
    ] = False,
) -> None:
    """The newest runs: when, what, which setup (fingerprint), and how fast."""
    from pitstop.history.compare import format_metric

    if all_projects:
        _list_projects(json_out)
        return
    with _store(history) as store:
        runs = store.list(limit=limit, kind=kind, label=label)
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in runs], indent=1))
        return
    if not runs:
        typer.echo(f"no runs recorded in {shown(store.path)}{shown(_legacy_hint(store.path))}")
        return
    from rich.table import Table

    table = Table(caption=as_text(store.path), show_edge=False)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("when", no_wrap=True, min_width=11)
    table.add_column("kind", min_width=6)
    table.add_column("label", min_width=6)
    table.add_column("command", overflow="ellipsis")
    table.add_column("fingerprint", no_wrap=True, min_width=12)
    table.add_column("real tok/s", justify="right", no_wrap=True)
    table.add_column("MFU", justify="right", no_wrap=True)
    for r in runs:
        table.add_row(
            str(r.id),
            as_text(_when(r.created_at, short=True)),
            as_text(f"{r.kind}, failed" if r.failed else r.kind, style="red" if r.failed else ""),
            as_text(r.label or "–"),
            as_text(_short(r.command), one_line=True),
            as_text(r.fingerprint),
            format_metric("real_tokens_per_s", r.real_tokens_per_s),
            format_metric("mfu", r.mfu),
        )
    _console().print(table)
    for r in runs:  # a failed run is kept, never a baseline: how it failed, under the table
        if r.failure is not None:
            _console().print(as_text(f"#{r.id}: {r.failure}", one_line=True), style="red", soft_wrap=True)
    hint = _legacy_hint(store.path)
    if hint:
        _console().print(as_text(hint.strip(" ()")), style="dim", soft_wrap=True)


def _list_projects(json_out: bool) -> None:
    """Each history file in the data folder: the projects' own, and the one they all shared before (read
    only; a file that cannot be read is listed with why, never changed)."""
    from pitstop.history.paths import legacy_path, project_histories, project_path

    try:
        legacy, files, here = legacy_path(), project_histories(), project_path()
    except HistoryError as exc:
        raise _fail(str(exc)) from None
    paths = ([legacy] if legacy.is_file() else []) + files
    entries: list[dict[str, object]] = []
    for path in paths:
        entry: dict[str, object] = {
            "path": str(path),
            "project": "(every project, before per-project histories)" if path == legacy else path.stem,
            "current": path == here,
        }
        try:
            with open_store(path, create=False) as store:
                newest = store.list(limit=1)
                entry["runs"] = store.count()
                entry["newest"] = newest[0].created_at if newest else None
        except HistoryError as exc:
            entry["error"] = str(exc)
        entries.append(entry)
    if json_out:
        typer.echo(json.dumps(entries, indent=1))
        return
    if not entries:
        typer.echo(f"no history recorded yet (this project's would be {shown(here)})")
        return
    from rich.table import Table

    table = Table(caption="pitstop history list --history PATH: one file's runs", show_edge=False)
    for column in ("project", "runs", "newest", "path"):
        table.add_column(column, justify="right" if column == "runs" else "left")
    for entry in entries:
        mark = " (here)" if entry["current"] else ""
        runs = "unreadable" if "error" in entry else str(entry["runs"])
        when = entry.get("newest")
        table.add_row(
            as_text(f"{entry['project']}{mark}"),
            runs,
            as_text(_when(str(when), short=True) if when else "–"),
            as_text(entry["path"]),
        )
    _console().print(table)


@history_app.command()
def show(
    run_id: Annotated[int, typer.Argument(metavar="ID", help="The run id (see `pitstop history list`).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the stored document as JSON.")] = False,
    history: HistoryOpt = None,
) -> None:
    """One stored run: its setup, its numbers, and (with --json) the whole stored document."""
    from pitstop.history.compare import METRIC_NAMES, flatten, format_metric
    from pitstop.history.documents import METRIC_COLUMNS, STORED_FIGURES, stored_figures

    with _store(history) as store:
        run = _require(store, run_id)
    if json_out:
        typer.echo(json.dumps(run.result, indent=1))
        return
    from rich.table import Table

    table = Table(title=f"run #{run.id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("when", _when(run.created_at)),
        ("kind", run.kind),
        ("label", run.label or "–"),
        ("git commit", run.git_commit or "–"),
        ("command", run.command or "–"),
        ("fingerprint", run.fingerprint),
    ]
    rows += [(f"  {k}", "–" if v is None else str(v)) for k, v in flatten(run.fingerprint_fields).items()]
    rows += [(METRIC_NAMES[name], format_metric(name, run.metric(name))) for name in METRIC_COLUMNS]
    doc = run.result or {}
    rows += [(STORED_FIGURES[name], format_metric(name, v)) for name, v in stored_figures(doc).items()]
    if isinstance(doc.get("findings"), list):
        causes = [str(f.get("cause")) for f in doc["findings"] if isinstance(f, dict)]
        rows.append(("findings", ", ".join(causes) or "none"))
    best = doc.get("best")
    if isinstance(best, dict) and isinstance(best.get("speedup"), int | float):
        fixes = best.get("fixes") or ([best["fix"]] if best.get("fix") else [])
        rows.append(("best", f"×{best['speedup']:.2f} with {', '.join(map(str, fixes)) or '?'}"))
    for field, value in rows:
        table.add_row(as_text(field), as_text(value))
    _console().print(table)


@history_app.command()
def compare(
    a: Annotated[int, typer.Argument(metavar="A", help="The first run id (the reference).")],
    b: Annotated[int, typer.Argument(metavar="B", help="The second run id.")],
    history: HistoryOpt = None,
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json", help=f"Also write both runs as JSON ({schemas.HISTORY}; `pitstop report` renders it)."
        ),
    ] = None,
) -> None:
    """Two runs side by side: setup fields and library versions that differ are highlighted; metrics show the
    ratio B/A, phases their time per step; a slowdown an upgrade brought is named (library_upgrade)."""
    from pitstop.history.compare import compare_runs

    with _store(history) as store:
        run_a, run_b = _require(store, a), _require(store, b)
    comparison = compare_runs(run_a, run_b)
    if json_file is not None:
        doc = {"schema": schemas.HISTORY, "runs": [run_a.to_dict(), run_b.to_dict()]}
        from pitstop.cli.outputs import check_target, write_output

        try:
            check_target(json_file, "--json")
            write_output(json_file, json.dumps(doc, indent=1, default=str))
        except UserError as exc:
            raise _fail(str(exc), exc.code) from None
    table = _comparison_table(comparison)
    console = _console(stderr=json_file is not None and str(json_file) == "-")
    console.print(table)
    for line in comparison.noise_lines():
        console.print(as_text(line), soft_wrap=True)
    if comparison.versions:
        console.print(
            as_text("library versions changed (A → B): " + ", ".join(str(c) for c in comparison.versions)),
            soft_wrap=True,
        )
    if comparison.finding is not None:
        _print_finding(console, comparison.finding)
    if comparison.differ:
        typer.secho(
            f"pitstop: warning: the runs have different setups ({shown(', '.join(comparison.differ))} differ); "
            "the numbers are not directly comparable",
            err=True,
            fg="yellow",
        )


def _comparison_table(comparison: Comparison) -> Table:
    """Run A and run B: setup fields, library versions (those that changed marked), metrics with B/A, and
    each phase's time per step (where a slower step grew)."""
    from rich.table import Table

    from pitstop.history.compare import METRIC_NAMES, flatten

    run_a, run_b, differ = comparison.a, comparison.b, comparison.differ
    table = Table(title=f"run #{run_a.id} vs run #{run_b.id}")
    for name in ("", f"A  #{run_a.id}", f"B  #{run_b.id}", "B/A"):
        table.add_column(name, justify="left" if not name or name.startswith("A") else "right")
    table.add_row("kind", as_text(run_a.kind), as_text(run_b.kind), "")
    table.add_row("label", as_text(run_a.label or "–"), as_text(run_b.label or "–"), "")
    table.add_row("fingerprint", as_text(run_a.fingerprint), as_text(run_b.fingerprint), "")
    flat_a, flat_b = flatten(run_a.fingerprint_fields), flatten(run_b.fingerprint_fields)
    for key in sorted(set(flat_a) | set(flat_b)):
        style = "bold yellow" if key in differ else None
        mark = "≠" if key in differ else ""
        cells = (as_text(f"  {key}"), as_text(flat_a.get(key, "–")), as_text(flat_b.get(key, "–")))
        table.add_row(*cells, mark, style=style)
    versions_a, versions_b = run_a.versions, run_b.versions
    changed = {c.package for c in comparison.versions}
    for package in sorted(set(versions_a) | set(versions_b)):
        cells = (
            as_text(f"  {package}"),
            as_text(versions_a.get(package, "–")),
            as_text(versions_b.get(package, "–")),
        )
        mark, style = ("≠", "bold yellow") if package in changed else ("", None)
        table.add_row(*cells, mark, style=style)
    for row in comparison.rows:  # real tokens/s with each run's noise band and the ratio's
        table.add_row(
            METRIC_NAMES[row.name],
            as_text(row.value_text("a")),
            as_text(row.value_text("b")),
            as_text(row.ratio_text()),
        )
    for delta in comparison.phases:
        ratio = "–" if delta.ratio is None else f"×{delta.ratio:.2f}"
        table.add_row(
            as_text(f"{delta.phase.label} / step"),
            f"{delta.before_s * 1000:,.1f} ms",
            f"{delta.after_s * 1000:,.1f} ms",
            ratio,
        )
    return table


def _print_finding(console: Console, finding: Finding) -> None:
    """A finding of the comparison: its cause, what was seen, the estimate and its basis, the fix."""
    from rich.text import Text

    estimate = "not estimated" if finding.est_speedup is None else f"×{finding.est_speedup:.2f}"
    console.print(Text(f"{finding.cause}: {finding.title}", style="bold red"), soft_wrap=True)
    console.print(as_text(finding.summary), soft_wrap=True)
    console.print(as_text(f"estimate: {estimate} ({finding.speedup_basis})"), soft_wrap=True)
    console.print(as_text(f"fix: {finding.fix.text}"), soft_wrap=True)
    snippet = finding.fix.snippet
    if snippet:
        console.print(as_text(snippet), soft_wrap=True)


@history_app.command("calibration")
def calibration_table(
    json_out: Annotated[bool, typer.Option("--json", help="Print the pairs and figures as JSON.")] = False,
    history: HistoryOpt = None,
) -> None:
    """How well each cause's estimated speed-up predicted what `pitstop tune` measured on your own jobs."""
    from pitstop.history.calibration import calibrations

    with _store(history) as store:
        known = calibrations(store)
    if json_out:
        typer.echo(json.dumps([c.to_dict() for c in known], indent=1))
        return
    if not known:
        typer.echo("no tune run in this history measured a fix with an estimate: run `pitstop tune` first")
        return
    from rich.table import Table

    table = Table(title="estimated speed-up against what tune measured, per cause")
    for column in ("cause", "measurements", "predicted → measured", "measured / predicted", "median |log|"):
        table.add_column(column, justify="left" if column in ("cause", "predicted → measured") else "right")
    for cal in known:
        pairs = ", ".join(f"×{p.predicted:.2f}→×{p.measured:.2f} ({p.fix})" for p in cal.pairs[-4:])
        more = f" … {len(cal.pairs) - 4} more" if len(cal.pairs) > 4 else ""
        table.add_row(
            as_text(cal.cause),
            str(len(cal.pairs)),
            as_text(pairs + more),
            f"×{cal.factor:.2f}",
            f"{cal.error:.2f}",
        )
    _console().print(table)
    typer.echo(
        "A later doctor run of a job with the same fingerprint has its estimates scaled by its own pairs."
    )


def _versions_said(run: RunRecord, base: RunRecord) -> str:
    """What changed in the library versions since the baseline, on the verdict's one line; with
    library_upgrade's finding (slower beyond the noise) the phase that grew and the estimate too."""
    from pitstop.history.upgrade import upgrade_finding, version_changes_of

    changes = version_changes_of(base, run)
    if not changes:
        return ""
    said = f"; library versions changed since run #{base.id}: {', '.join(str(c) for c in changes)}"
    finding = upgrade_finding(run, base)
    if finding is None:
        return said
    evidence = finding.evidence
    phase = evidence.get("slowest_phase")
    grew = (
        f", {phase} grew most (+{evidence.get('slowest_phase_delta_ms'):,.1f} ms a step)"
        if phase and isinstance(evidence.get("slowest_phase_delta_ms"), int | float)
        else ""
    )
    recovers = f"; pinning them back would recover ×{finding.est_speedup:.2f}" if finding.est_speedup else ""
    return f"{said} ({finding.cause}{grew}{recovers})"


@history_app.command("check")
def check_run(
    baseline: Annotated[
        str,
        typer.Option(help="A run id, or a label: the newest run with it and the same setup is the baseline."),
    ],
    max_drop: Annotated[str, typer.Option("--max-drop", help="The largest drop allowed: 5% or 0.05.")] = "5%",
    run_id: Annotated[
        int | None, typer.Option("--run", help="The run to check (default: the latest run).")
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            help="real_tokens_per_s, tokens_per_s, step_time_s, mfu, joules_per_real_token or "
            "cost_per_million_real_tokens (the last two: a rise is the regression)."
        ),
    ] = "real_tokens_per_s",
    history: HistoryOpt = None,
) -> None:
    """Exit 1 when a run is slower than its baseline by more than --max-drop (for CI); 0 when it is not.

    Exit 2 when there is nothing to compare: no runs, an unknown id, or no baseline with the same setup.
    """
    from pitstop.history.compare import check, find_baseline, fingerprint_diff, parse_max_drop

    with _store(history) as store:
        allowed = parse_max_drop(max_drop)
        if run_id is None:
            latest = store.latest()
            if latest is None:
                raise HistoryError(f"no runs recorded in {store.path}")
            run = latest
        else:
            run = _require(store, run_id)
        base = find_baseline(store, run, baseline)
        # the whole documents, for each run's measured spread
        verdict = check(store.get(run.id) or run, store.get(base.id) or base, metric, allowed)
    message = verdict.message()
    if base.fingerprint != run.fingerprint:  # only when asked for by id; said on the same one line
        differ = ", ".join(fingerprint_diff(base.fingerprint_fields, run.fingerprint_fields))
        message += f" (note: baseline run #{base.id} has a different setup: {differ})"
    message += _versions_said(verdict.run, verdict.baseline)
    if verdict.regression:
        raise _fail(f"regression: {message}", 1)
    typer.echo(f"{'undecided' if verdict.undecided else 'ok'}: {shown(message)}")
