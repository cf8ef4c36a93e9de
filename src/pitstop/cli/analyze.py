"""``pitstop analyze`` and ``pitstop check``: artifacts in, the same diagnosis and JSON as the doctor's."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pitstop.cli.doctor import check_json_target, write_json
from pitstop.cli.errors import UserError
from pitstop.diagnose import diagnose
from pitstop.ingest.errors import IngestError
from pitstop.ingest.load import Inputs, load_run
from pitstop.report.terminal import render


def run_analyze(
    paths: list[Path],
    gpu: str | None,
    gpus: int | None,
    model: str | None,
    json_out: Path | None,
    configs_only: bool,
    history: Path | None = None,
    record: bool = False,
    html: Path | None = None,
    tensorboard: Path | None = None,
) -> int:
    from pitstop.cli.report import check_target, write_html, write_tensorboard

    check_json_target(json_out)
    check_target(html)
    console = Console(stderr=True)
    inputs = Inputs(paths=paths, gpu=gpu, gpus=gpus, model=model, configs_only=configs_only)
    try:
        with console.status("reading") as status:
            profile = load_run(inputs, on_file=lambda p, kind: status.update(f"reading {p.name} ({kind})"))
    except IngestError as exc:
        raise UserError(str(exc), 2) from None
    diagnosis = diagnose(profile)
    write_json(diagnosis, json_out, {"inputs": inputs.kinds})
    write_html(diagnosis.to_dict() | {"inputs": inputs.kinds}, html)
    write_tensorboard(diagnosis.to_dict(), tensorboard)
    render(diagnosis)
    if record and diagnosis.metrics.real_tokens_per_s is not None:
        from pitstop.cli.remember import remember

        remember(diagnosis.to_dict() | {"inputs": inputs.kinds}, "analyze", history)
    return 0
