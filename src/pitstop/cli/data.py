"""``pitstop data``: padding stats, the token cache, packing plans. Only typer is imported at module level
(rich's tables and progress bars when a command runs): app.py mounts this group on every ``pitstop``."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pitstop import schemas
from pitstop.cli.errors import UserError
from pitstop.report.untrusted import markup

if TYPE_CHECKING:
    from rich.console import Console

data_app = typer.Typer(
    help="Pre-tokenize once, pack without cross-contamination, measure padding.", no_args_is_help=True
)

TokenizerOpt = Annotated[
    str | None, typer.Option("--tokenizer", help="tokenizer.json, or a folder holding it")
]
TemplateOpt = Annotated[
    str, typer.Option(help="auto, alpaca, chatml, tokenizer (its chat template) or plain")
]


def _default_cache() -> Path:
    from pitstop.demo.prepare import cache_root

    return cache_root() / "data"


def _count_lines(path: Path) -> int | None:
    if path.is_file() and path.suffix.lower() in (".jsonl", ".csv"):
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    return None


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so a build ends like on Ctrl-C: pool ended, progress reported."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cache_of(
    source: Path,
    tokenizer: str | None,
    template: str,
    out: Path | None,
    workers: int | None,
    skip_bad: bool,
    console: Console,
) -> Path:
    """A built cache for ``source``: the cache itself, or the one made (or reused) for a data file.

    Ctrl-C and SIGTERM end the build in one line that says what was kept for the resume (exit 130 / 143).
    """
    from pitstop.data.cache import open_cache
    from pitstop.data.errors import BuildInterrupted

    if source.is_dir() and ((source / "meta.json").exists() or any(source.glob("*/meta.json"))):
        return open_cache(source).path
    if tokenizer is None:
        raise UserError(f"{source}: a data file needs --tokenizer (tokenizer.json or a folder holding it)")
    total = _count_lines(source)
    try:
        with _sigterm_stops():
            return _build(source, tokenizer, template, out, workers, skip_bad, console, total)
    except BuildInterrupted as stop:
        by_term = isinstance(stop.__cause__, _Terminated)
        raise UserError(
            f"stopped by {'SIGTERM' if by_term else 'Ctrl-C'}: {stop.kept()}", 143 if by_term else 130
        ) from None


def _build(
    source: Path,
    tokenizer: str,
    template: str,
    out: Path | None,
    workers: int | None,
    skip_bad: bool,
    console: Console,
    total: int | None,
) -> Path:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pitstop.data.cache import build_cache

    with Progress(
        TextColumn("[bold]tokenizing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("tokenizing", total=total)
        return build_cache(
            source,
            tokenizer,
            out or _default_cache(),
            template=template,
            workers=workers,
            skip_bad=skip_bad,
            on_progress=lambda n: progress.advance(task, n),
            on_note=lambda text: progress.console.print(f"[yellow]{markup(text)}[/yellow]"),
        )


def _write_json(path: Path | None, doc: dict[str, object]) -> None:
    if path is None:
        return
    from pitstop.cli.outputs import check_target, write_output

    check_target(path, "--json")
    write_output(path, json.dumps(doc, indent=1))


DEFAULT_MAX_LEN = 2048
DEFAULT_BATCH = 8


@data_app.command()
def stats(
    source: Annotated[Path, typer.Argument(help="JSONL / JSON / Parquet / CSV / saved dataset, or a cache")],
    tokenizer: TokenizerOpt = None,
    max_len: Annotated[
        int | None,
        typer.Option(
            "--max-len",
            "--max-length",
            min=1,
            help=f"Row length the run uses: truncation, and the width of every row with --padding max_length "
            f"(default: the run's with --run, else {DEFAULT_MAX_LEN}).",
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            help=f"Micro-batch size the run uses (default: the run's with --run, else {DEFAULT_BATCH}).",
        ),
    ] = None,
    padding: Annotated[
        str | None,
        typer.Option(
            help="How the run pads today: longest (each batch to its longest example) or max_length (every "
            'row to --max-len, the tokenizer\'s padding="max_length"). Default: what --run saw, else longest.'
        ),
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            help="A `pitstop doctor --json` result of the job: its padding, row length and batch size "
            "as measured (options given here win).",
        ),
    ] = None,
    template: TemplateOpt = "auto",
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip and count unreadable examples.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON.")] = None,
) -> None:
    """How much of each batch is padding today, with length grouping, and with packing."""
    from rich.console import Console
    from rich.table import Table

    from pitstop.data.cache import open_cache
    from pitstop.data.stats import length_stats

    if padding is not None and padding not in ("longest", "max_length"):
        raise UserError("--padding is longest or max_length")
    padding, max_len, batch_size, basis = _job_padding(run, padding, max_len, batch_size)
    console = Console(stderr=True)
    cache = open_cache(cache_of(source, tokenizer, template, None, None, skip_bad, console))
    s = length_stats(cache.lengths.tolist(), batch_size, max_len, padding, padding_basis=basis)
    table = Table(
        title=f"{source.name}: {s.examples:,} examples, {s.tokens:,} tokens (at most {max_len} each)",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("padding share", justify="right")
    table.add_column("expected speed-up", justify="right")
    today = (
        "every row padded to " + str(max_len)
        if padding == "max_length"
        else "each batch padded to its longest"
    )
    table.add_row(f"today (batch {batch_size}, {today})", f"{s.padding_now:.1%}", "×1.00")
    table.add_row("length-grouped batches", f"{s.padding_grouped:.1%}", f"×{s.speedup_grouped:.2f}")
    table.add_row(f"packed into {max_len}-token rows", f"{s.padding_packed:.1%}", f"×{s.speedup_packed:.2f}")
    out = Console()
    out.print(
        f"tokens per example: min {s.min}, median {s.median:.0f}, p90 {s.p90:.0f}, max {s.max}"
        + (f"; {s.over_max_len} longer than {max_len}" if s.over_max_len else "")
    )
    out.print(markup(f"padding assumed: {padding} ({basis})"), soft_wrap=True)
    out.print(table)
    out.print(
        "[dim]speed-up: real tokens per computed token relative to today (compute scales with tokens; "
        "attention's quadratic part gains more)[/dim]"
    )
    _write_json(json_out, {"schema": schemas.DATA_STATS, "cache": str(cache.path), **s.to_dict()})


def _job_padding(
    run: Path | None, padding: str | None, max_len: int | None, batch_size: int | None
) -> tuple[str, int, int, str]:
    """The padding, row length and batch size to price today's batches with, and why: an option given, else
    what the run measured (--run), else the defaults (padding to the longest example, said as assumed)."""
    if run is None:
        if padding is not None:
            basis = f"--padding {padding}"
        else:
            basis = (
                "the default, not measured: a job that pads every row to --max-len (a tokenizer called with "
                'padding="max_length") wastes more: --padding max_length, or --run with its doctor JSON'
            )
        return padding or "longest", max_len or DEFAULT_MAX_LEN, batch_size or DEFAULT_BATCH, basis
    from pitstop.cli.report import read_result
    from pitstop.data.stats import job_padding

    doc = read_result(run)
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(schemas.RUN.split("/")[0]):
        raise UserError(f"--run {run}: not a pitstop doctor result (schema {schemas.RUN})")
    seen = job_padding(doc)
    basis = f"{seen.basis}; read from {run.name}" if padding is None else f"--padding {padding}"
    width = max_len or (seen.max_len if seen.padding == "max_length" else None) or DEFAULT_MAX_LEN
    return padding or seen.padding, width, batch_size or seen.batch_size or DEFAULT_BATCH, basis


@data_app.command()
def cache(
    source: Annotated[Path, typer.Argument(help="JSONL / JSON / Parquet / CSV / saved dataset")],
    tokenizer: TokenizerOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Cache folder (one sub-folder per content key).")] = Path(
        "cache"
    ),
    template: TemplateOpt = "auto",
    workers: Annotated[
        int | None, typer.Option(min=1, help="Tokenizer processes (default: CPUs, up to 8).")
    ] = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip and count unreadable examples.")] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Check every array's SHA-256 after building (opening checks their CRC-32)."
        ),
    ] = False,
) -> None:
    """Tokenize once into a content-addressed, memory-mapped cache (resumable; reused when unchanged)."""
    from rich.console import Console

    from pitstop.data.cache import open_cache

    console = Console(stderr=True)
    started = time.perf_counter()
    if tokenizer is None:
        raise UserError("--tokenizer is needed (tokenizer.json, or a folder holding it)")
    path = cache_of(source, tokenizer, template, out, workers, skip_bad, console)
    built = open_cache(path)
    if verify:
        built.verify()
    m = built.meta
    seconds = time.perf_counter() - started
    Console().print(
        f"{markup(path)}: {m.examples:,} examples, {m.tokens:,} tokens ({m.trained_tokens:,} trained on), "
        f"{m.token_dtype}, {seconds:.1f} s" + (f"; {m.skipped} examples skipped" if m.skipped else "")
    )


@data_app.command()
def pack(
    source: Annotated[
        Path,
        typer.Argument(help="A cache, a dataset file (with --tokenizer), or a .npy / text file of lengths"),
    ],
    max_len: Annotated[int, typer.Option("--max-len", min=1, help="Row length.")] = 4096,
    overflow: Annotated[
        str, typer.Option(help="Examples longer than a row: truncate, split or drop.")
    ] = "truncate",
    split: Annotated[bool, typer.Option("--split", help="Same as --overflow split.")] = False,
    tokenizer: TokenizerOpt = None,
    template: TemplateOpt = "auto",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the plan (bins included) as JSON.")
    ] = None,
) -> None:
    """Plan best-fit-decreasing packing over the whole dataset and report its efficiency."""
    import numpy as np
    from rich.console import Console

    from pitstop.data.cache import open_cache
    from pitstop.data.packing import plan_packing

    if split:
        overflow = "split"
    if overflow not in ("truncate", "split", "drop"):
        raise UserError("--overflow is truncate, split or drop")
    console = Console(stderr=True)
    if source.is_file() and (source.suffix == ".npy" or source.suffix == ".txt"):
        try:
            lengths = (
                np.load(source) if source.suffix == ".npy" else np.loadtxt(source, dtype=np.int64, ndmin=1)
            )
        except (OSError, ValueError) as exc:
            raise UserError(f"{source}: not a file of lengths ({exc})") from None
    else:
        lengths = open_cache(cache_of(source, tokenizer, template, None, None, False, console)).lengths
    plan = plan_packing(np.asarray(lengths, dtype=np.int64), max_len, overflow)  # type: ignore[arg-type]
    doc = plan.to_dict(with_bins=json_out is not None)
    Console().print(
        f"{len(plan.piece_rows):,} rows of {max_len} tokens for {plan.total_tokens:,} tokens: efficiency "
        f"{plan.efficiency:.2%} (lower bound {plan.lower_bound:,} rows); {len(plan.too_long)} examples longer than "
        f"a row ({overflow}); planned in {plan.seconds * 1000:.0f} ms"
    )
    _write_json(json_out, {"schema": schemas.DATA_PACK, **doc})
