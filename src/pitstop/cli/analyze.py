"""``pitstop analyze`` and ``pitstop check``: artifacts in, the same diagnosis and JSON as the doctor's."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pitstop.artifacts import IngestError
from pitstop.cli.errors import UserError
from pitstop.cli.money import resolve_price, resolve_total_steps, with_savings
from pitstop.cli.outputs import Outputs
from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.report.terminal import render


def _trace_progress(done: int, total: int, name: str) -> str:
    width = 24
    filled = round(width * done / total) if total else width
    return f"traces {'█' * filled}{'░' * (width - filled)} {done}/{total} ({name})"


DASK_EXTRA = "pip install 'pitstop[dask]'"


def _require_dask() -> None:
    """``--dask`` without the extra: one line naming it, before any file is read."""
    try:
        import dask.distributed  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "dask.distributed"
        raise UserError(
            f"--dask needs dask and distributed ({missing} is not installed): {DASK_EXTRA}", 2
        ) from None


def run_analyze(
    paths: list[Path],
    gpu: str | None,
    gpus: int | None,
    model: str | None,
    configs_only: bool,
    outputs: Outputs,
    jobs: int | None = None,
    dask: str | None = None,
    price_per_gpu_hour: str | float | None = None,  # as typed: cli/money.py parses and refuses it
    total_steps: str | int | None = None,
) -> int:
    outputs.check()
    price = resolve_price(price_per_gpu_hour)
    total = resolve_total_steps(total_steps)
    if dask is not None:
        _require_dask()
    console = Console(stderr=True)
    inputs = Inputs(
        paths=paths, gpu=gpu, gpus=gpus, model=model, configs_only=configs_only, jobs=jobs, dask=dask
    )
    try:
        with console.status("reading") as status:
            profile = load_run(
                inputs,
                on_file=lambda p, kind: status.update(f"reading {p.name} ({kind})"),
                on_trace=lambda done, total, name: status.update(_trace_progress(done, total, name)),
            )
    except IngestError as exc:
        raise UserError(str(exc), 2) from None
    diagnosis = diagnose(profile)
    with_savings(diagnosis, price, total)
    doc = diagnosis.to_dict() | {"inputs": inputs.kinds}  # with the run's cost at the price, where given
    outputs.write(doc)
    render(diagnosis, outputs.terminal())  # energy and cost among the headline rows
    if diagnosis.metrics.real_tokens_per_s is not None:  # only a measured throughput belongs in the history
        outputs.remember(doc, "analyze")
    return 0
