"""The ``pitstop`` command line. Thin: parse arguments, call the pipeline, render.

Every command is registered here, at import, by typer itself, one way: a command is a function below
decorated with ``@app.command()`` (its options in its signature, its work imported from ``cli/<name>.py``
inside its body); a group of sub-commands (``history``, ``data``) is a ``typer.Typer`` in ``cli/<name>.py``,
mounted by ``app.add_typer`` at the end of this module. This module and those groups import only light things
at module level, so ``pitstop --help`` and each command's ``--help`` load no torch, transformers, NVML or
tracker (tests/unit/test_light_import.py).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from pitstop import schemas
from pitstop.cli.data import data_app
from pitstop.cli.errors import UserError
from pitstop.cli.history import history_app
from pitstop.errors import PitstopError

app = typer.Typer(
    name="pitstop",
    help="Find out why a fine-tuning run is slower than it should be, and what to change.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write a self-contained HTML report with plots.")
]
TensorboardOpt = Annotated[
    Path | None,
    typer.Option("--tensorboard", help="Also write the per-step metrics as TensorBoard scalars here."),
]
HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="The history database (default: $PITSTOP_HISTORY, else one per project: the git root).",
    ),
]
NoHistoryOpt = Annotated[bool, typer.Option("--no-history", help="Do not record this result in the history.")]
CommandArg = Annotated[list[str] | None, typer.Argument(help="The training command, after `--`.")]
TimeoutOpt = Annotated[float | None, typer.Option(help="Stop the command after this many seconds.")]
PriceOpt = Annotated[  # text, parsed by cli/money.py: a bad one is one line, not typer's usage box
    str | None,
    typer.Option(
        "--price-per-gpu-hour",
        metavar="FLOAT",
        help="What a GPU costs per hour: adds the cost per million real tokens and what each fix would save "
        "in money (default: $PITSTOP_PRICE_PER_GPU_HOUR).",
    ),
]
TotalStepsOpt = Annotated[  # text, parsed by cli/money.py like the price
    str | None,
    typer.Option(
        "--total-steps",
        metavar="N",
        help="The run's length in optimizer steps, where it does not say (a plain loop): each finding then "
        "says the time (and money) its fix would save over the steps left.",
    ),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    """One line on stderr (control characters from paths or files written out as escapes) and the code."""
    from pitstop.report.untrusted import shown

    typer.secho(f"pitstop: {shown(message)}", err=True, fg="red")
    return typer.Exit(code)


@app.command(context_settings={"allow_interspersed_args": False})
def doctor(
    command: CommandArg = None,
    steps: Annotated[
        str,
        typer.Option(
            help="Optimizer steps to measure after the warm-up, or 'auto': warm up until the steps settle and "
            "measure until the mean step time is known to ±3% (a job of several ranks keeps 50)."
        ),
    ] = "50",
    warmup: Annotated[int, typer.Option(min=0, help="Optimizer steps to run before measuring.")] = 10,
    full: Annotated[
        bool, typer.Option("--full", help="Let the run finish; measure every step after warm-up.")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help=f"Write the diagnosis as JSON ({schemas.RUN}).")
    ] = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Diagnose the built-in, deliberately slow example.")
    ] = False,
    fixed: Annotated[
        bool, typer.Option("--fixed", help="With --demo: also run it with the fixes and compare.")
    ] = False,
    quiet: Annotated[
        bool | None, typer.Option("--quiet/--verbose", help="Hide / show the command's output.")
    ] = None,
    timeout: TimeoutOpt = None,
    html: HtmlOpt = None,
    tensorboard: TensorboardOpt = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
    price: PriceOpt = None,
    total_steps: TotalStepsOpt = None,
) -> None:
    """Run a training command, measure a short window of steps, and diagnose it.

    pitstop doctor -- python train.py --my-args
    """
    from pitstop.cli.doctor import parse_window_steps, run_demo, run_doctor
    from pitstop.cli.outputs import Outputs

    outputs = Outputs(json_out, html, tensorboard, history, record=not no_history)
    try:
        count, auto = parse_window_steps(steps)
        if demo:
            if auto:
                raise UserError("--demo measures a fixed window: give --steps a number")
            code = run_demo(
                steps=count, warmup=warmup, fixed=fixed, quiet=quiet is not False, outputs=outputs
            )
        else:
            if fixed:
                raise UserError("--fixed goes with --demo")
            if not command:
                raise UserError("no command given: pitstop doctor -- python train.py [args]")
            code = run_doctor(
                command,
                steps=count,
                warmup=warmup,
                auto=auto,
                full=full,
                quiet=bool(quiet),
                timeout=timeout,
                outputs=outputs,
                price_per_gpu_hour=price,
                total_steps=total_steps,
            )
    except UserError as exc:
        raise fail(str(exc), exc.code) from None
    raise typer.Exit(code)


@app.command(context_settings={"allow_interspersed_args": False})
def watch(
    command: CommandArg = None,
    window_steps: Annotated[int, typer.Option(min=4, help="Close a window every this many steps.")] = 200,
    window_seconds: Annotated[
        float | None, typer.Option(min=1, help="... or every this many seconds of steps, if sooner.")
    ] = None,
    min_drop: Annotated[
        float,
        typer.Option(
            min=0.01,
            max=0.9,
            help="Smallest tokens/s drop reported, beyond the noise (0.5: to half; a rise: ×2).",
        ),
    ] = 0.10,
    warmup: Annotated[int, typer.Option(min=0, help="Optimizer steps before watching.")] = 10,
    report_to: Annotated[
        str | None,
        typer.Option("--report-to", help="Trackers, comma-separated: tensorboard, wandb, mlflow, trackio."),
    ] = None,
    logdir: Annotated[Path, typer.Option(help="With --report-to tensorboard: the log folder.")] = Path(
        "runs"
    ),
    series: Annotated[
        Path | None, typer.Option(help="Keep the compressed per-step series of every rank in this folder.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help=f"Write the result as JSON ({schemas.RUN} with `watch`).")
    ] = None,
    timeout: TimeoutOpt = None,
    html: HtmlOpt = None,
    tensorboard: TensorboardOpt = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
) -> None:
    """Watch a whole run (never stopped): windows, changes as they happen, periodic stalls, a final report.

    pitstop watch --report-to tensorboard,wandb -- python train.py
    """
    from pitstop.cli.outputs import Outputs
    from pitstop.cli.watch import WatchOptions, run_watch

    outputs = Outputs(json_out, html, tensorboard, history, record=not no_history)
    options = WatchOptions(
        window_steps=window_steps,
        window_seconds=window_seconds,
        min_drop=min_drop,
        warmup=warmup,
        report_to=report_to,
        logdir=logdir,
        series=series,
        timeout=timeout,
    )
    try:
        if not command:
            raise UserError("no command given: pitstop watch -- python train.py [args]")
        code = run_watch(command, options, outputs)
    except UserError as exc:
        raise fail(str(exc), exc.code) from None
    raise typer.Exit(code)


GpuOpt = Annotated[str | None, typer.Option(help="The GPU of the run (e.g. H100-SXM, A100-80GB), for MFU.")]
GpusOpt = Annotated[int | None, typer.Option(min=1, help="How many GPUs the run uses.")]
ModelOpt = Annotated[str | None, typer.Option(help="The model's config.json (or its folder), for FLOPs.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help=f"Write the diagnosis as JSON ({schemas.RUN}).")]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile: a higher expected rate (plan).")]
PowerLimitOpt = Annotated[
    float | None, typer.Option("--power-limit", help="The GPU's power cap in watts: its peak derated (plan).")
]

# `pitstop plan`'s training choices (issue 44's among them): each the planner reads as a PlanRequest field
OptimizerOpt = Annotated[
    str,
    typer.Option(
        help="adamw (torch's foreach step), adamw_fused, adamw8bit, paged_adamw, paged_adamw8bit, sgd or adafactor."
    ),
]
PrecisionOpt = Annotated[
    str, typer.Option(help="mixed (fp32 master + moments) or bf16 (pure bf16 weights, grads, moments).")
]
AcOpt = Annotated[str, typer.Option("--ac", help="Activation checkpointing: none, full or selective.")]
AcEveryOpt = Annotated[
    int, typer.Option("--ac-every", min=0, help="With --ac selective: checkpoint every N-th layer.")
]
AcOffloadOpt = Annotated[bool, typer.Option("--ac-offload", help="Activations offloaded to host memory.")]
InBackwardOpt = Annotated[
    bool, typer.Option("--optimizer-in-backward", help="The optimizer steps inside backward.")
]
FrozenReshardOpt = Annotated[
    bool,
    typer.Option(
        "--frozen-reshard/--no-frozen-reshard",
        help="FSDP reshards a LoRA base's frozen weights in backward (--no-frozen-reshard: FSDP1 before "
        "PyTorch 2.1 keeps them all gathered).",
    ),
]
DoubleQuantOpt = Annotated[
    bool,
    typer.Option(
        "--double-quant/--no-double-quant",
        help="QLoRA: nf4 block constants double-quantized (bnb_4bit_use_double_quant), or kept fp32.",
    ),
]
ShardingOpt = Annotated[
    str | None,
    typer.Option(
        help="FSDP instead of --zero: no_shard, shard_grad_op, full_shard, hybrid_shard or hybrid_shard_zero2."
    ),
]
SimulateOpt = Annotated[
    bool,
    typer.Option(
        "--simulate/--no-simulate", help="Cross-check activations by simulating one step on fake tensors."
    ),
]
CheckpointingOpt = Annotated[
    bool, typer.Option("--checkpointing/--no-checkpointing", help="Activation checkpointing.")
]
ChunkedLossOpt = Annotated[bool, typer.Option("--chunked-loss", help="A fused / chunked cross-entropy.")]


@app.command(context_settings={"allow_interspersed_args": False})
def tune(
    command: CommandArg = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Tune the built-in, deliberately slow example.")
    ] = False,
    budget: Annotated[str, typer.Option(help="Total time for all windows (e.g. 10m, 90s).")] = "10m",
    steps: Annotated[
        str,
        typer.Option(
            help="Optimizer steps measured per window, or 'auto': warm up until steps settle, then measure "
            "until the mean step time is known to ±2.5% (baselines) or to what the expected gain needs."
        ),
    ] = "auto",
    warmup: Annotated[int, typer.Option(min=0, help="With a fixed --steps: steps before measuring.")] = 5,
    try_: Annotated[
        list[str] | None, typer.Option("--try", help="Also try these fixes (comma-separated).")
    ] = None,
    only: Annotated[list[str] | None, typer.Option(help="Try only these fixes.")] = None,
    skip: Annotated[list[str] | None, typer.Option(help="Never try these fixes.")] = None,
    keep_outputs: Annotated[
        bool,
        typer.Option("--keep-outputs", help="Let trials write checkpoints and logs where the job says."),
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help=f"Write the result as JSON ({schemas.TUNE}).")
    ] = None,
    html: HtmlOpt = None,
    tensorboard: TensorboardOpt = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
) -> None:
    """Try the diagnosed fixes on your own job, one short window each; keep what measurably helps.

    pitstop tune -- python train.py --my-args
    """
    from pitstop.cli.doctor import demo_command
    from pitstop.cli.tune import parse_budget, parse_fixes, parse_steps, run_tune
    from pitstop.tune.session import TuneOptions

    try:
        if demo and command:
            raise UserError("--demo runs the built-in example: give it no command")
        if not demo and not command:
            raise UserError("no command given: pitstop tune -- python train.py [args]")
        options = TuneOptions(
            steps=parse_steps(steps),
            warmup=warmup,
            budget_s=parse_budget(budget),
            also=parse_fixes("--try", try_ or []),
            only=parse_fixes("--only", only or []),
            skip=parse_fixes("--skip", skip or []),
            keep_outputs=keep_outputs,
        )
        if demo:
            from pitstop.demo.prepare import ensure_demo_assets

            ensure_demo_assets()
        from pitstop.cli.outputs import Outputs

        outputs = Outputs(json_out, html, tensorboard, history, record=not no_history)
        run_tune(demo_command(False) if demo else list(command or []), options, outputs)
    except UserError as exc:
        raise fail(str(exc), exc.code) from None


@app.command()
def report(
    path: Annotated[
        Path, typer.Argument(help="A saved result: --json of doctor, analyze, tune, or history.")
    ],
    html: HtmlOpt = None,
    tensorboard: TensorboardOpt = None,
) -> None:
    """Render a saved result as a self-contained HTML report (plots included) or TensorBoard scalars.

    pitstop report run.json --html report.html
    """
    from pitstop.cli.report import run_report

    try:
        raise typer.Exit(run_report(path, html, tensorboard))
    except UserError as exc:
        raise fail(str(exc), exc.code) from None


def _one_blas_thread() -> None:
    """Before numpy is imported by analyze / check (which start no job of the user's): one OpenBLAS thread.
    pitstop's numpy work is sorts and element-wise arrays, never BLAS, but OpenBLAS starts a thread per core
    that spin-waits for work: ~6% of analyze's CPU on a trace of 0.5 GiB. A value the user set is kept; the
    trace-reading processes of --jobs inherit it."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@app.command()
def analyze(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Traces (or folders of them), nvidia-smi CSV logs, "
            "trainer_state.json / *_results.json, configs."
        ),
    ],
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    model: ModelOpt = None,
    json_out: JsonOpt = None,
    html: HtmlOpt = None,
    tensorboard: TensorboardOpt = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", "-j", min=1, help="Traces read at once (default: from cores and free memory)."
        ),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask",
            metavar="ADDRESS|local",
            help="Read the traces on a Dask cluster (a scheduler address its workers share the files with), "
            "or 'local' for a LocalCluster.",
        ),
    ] = None,
    price: PriceOpt = None,
    total_steps: TotalStepsOpt = None,
) -> None:
    """Diagnose a run from what it left behind: profiler traces, nvidia-smi logs, Trainer outputs, configs."""
    _one_blas_thread()
    from pitstop.cli.analyze import run_analyze
    from pitstop.cli.outputs import Outputs

    outputs = Outputs(json_out, html, tensorboard, history, record=not no_history)
    raise typer.Exit(
        run_analyze(
            paths,
            gpu=gpu,
            gpus=gpus,
            model=model,
            configs_only=False,
            outputs=outputs,
            jobs=jobs,
            dask=dask,
            price_per_gpu_hour=price,
            total_steps=total_steps,
        )
    )


@app.command()
def check(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Training configs: TrainingArguments / SFTConfig (JSON or "
            "YAML), axolotl, LLaMA-Factory, Accelerate, DeepSpeed."
        ),
    ],
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    model: ModelOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Check training configs for known causes of slowness before the run starts."""
    _one_blas_thread()
    from pitstop.cli.analyze import run_analyze
    from pitstop.cli.outputs import Outputs

    raise typer.Exit(
        run_analyze(paths, gpu=gpu, gpus=gpus, model=model, configs_only=True, outputs=Outputs(json_out))
    )


@app.command()
def plan(
    model: Annotated[
        str, typer.Option(help="A config.json, a model folder, or a preset (see `pitstop plan --presets`)")
    ] = "",
    gpu: Annotated[str, typer.Option(help="The GPU (e.g. H100-SXM, A100-80GB, L4).")] = "H100-SXM",
    gpus: Annotated[int, typer.Option(min=1, help="GPUs in the job.")] = 1,
    seq: Annotated[
        str, typer.Option(help="Sequence length (tokens per row), or auto: the longest that fits.")
    ] = "2048",
    micro_batch: Annotated[str, typer.Option("--micro-batch", help="Rows per GPU per step, or auto.")] = "1",
    global_batch: Annotated[
        int | None,
        typer.Option(
            "--global-batch", min=1, help="Rows per optimizer step, to keep with gradient accumulation."
        ),
    ] = None,
    zero: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage (0 = plain DDP).")] = 0,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes the GPUs are spread over (evenly).")] = 1,
    sharding: ShardingOpt = None,
    hpz: Annotated[
        int, typer.Option(min=1, help="DeepSpeed ZeRO++ zero_hpz_partition_size (with --zero 3).")
    ] = 1,
    network: Annotated[
        str, typer.Option(help="The link between nodes: ib_ndr, ib_hdr, eth100, eth400, … (see docs).")
    ] = "ib_ndr",
    offload: Annotated[
        str, typer.Option(help="none, optimizer or param (DeepSpeed offload to CPU).")
    ] = "none",
    method: Annotated[str, typer.Option(help="full, lora or qlora.")] = "full",
    rank: Annotated[int, typer.Option(min=1, help="LoRA rank.")] = 16,
    optimizer: OptimizerOpt = "adamw",
    precision: PrecisionOpt = "mixed",
    ac: AcOpt = "none",
    ac_every: AcEveryOpt = 0,
    ac_offload: AcOffloadOpt = False,
    optimizer_in_backward: InBackwardOpt = False,
    frozen_reshard: FrozenReshardOpt = True,
    double_quant: DoubleQuantOpt = True,
    attn: Annotated[str, typer.Option(help="sdpa, flash or eager.")] = "sdpa",
    checkpointing: CheckpointingOpt = False,
    chunked_loss: ChunkedLossOpt = False,
    compile: CompileOpt = False,
    power_limit_w: PowerLimitOpt = None,
    simulate: SimulateOpt = True,
    presets: Annotated[bool, typer.Option("--presets", help="List the model presets and exit.")] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help=f"Write the plan as JSON ({schemas.PLAN}).")
    ] = None,
) -> None:
    """Memory, micro-batch, offload and expected speed for a model on a GPU, before the run."""
    if presets:
        from pitstop.plan.params import presets as known

        for name, cfg in known().items():
            typer.echo(f"{name:16} {cfg.get('model_type', '?'):10} {cfg.get('_source', '')}")
        raise typer.Exit(0)
    if not model:
        raise UserError(
            "--model is needed: a config.json, a model folder, or a preset (--presets lists them)"
        )
    from dataclasses import fields

    from pitstop.plan.memory import OPTIMIZERS

    if optimizer not in OPTIMIZERS:
        raise UserError(f"--optimizer is one of {', '.join(OPTIMIZERS)}")
    seq_value: int | str = seq if seq == "auto" else _whole(seq, "--seq")

    from pitstop.cli.plan import run_plan
    from pitstop.plan.build import PlanRequest

    here = locals() | {"seq": seq_value}
    raise typer.Exit(
        run_plan(json_out, **{f.name: here[f.name] for f in fields(PlanRequest) if f.name in here})
    )


def _whole(text: str, flag: str) -> int:
    """A whole-number option given as text (``--seq`` also takes auto)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UserError(f"{flag} is a whole number from 1, or auto")
    return int(text)


@app.command()
def gpus() -> None:
    """List the GPUs pitstop knows peaks for, with their sources."""
    from pitstop.hardware import GPUS

    for g in GPUS:
        peaks = " ".join(f"{k}={v:g}" for k, v in g.peak_tflops.items() if v is not None)
        watts = f"{g.board_w:g} W" if g.board_w else "module"
        typer.echo(
            f"{g.key:12} {g.memory_gib:6.1f} GiB  {g.generation or '':9} {watts:>7}  {peaks} TFLOP/s  |  {g.source}"
        )


@app.command()
def causes() -> None:
    """List the causes pitstop knows, with their stable ids."""
    from pitstop.diagnose.causes import CAUSES

    for c in CAUSES.values():
        gpu = " (GPU)" if c.needs_gpu else ""
        typer.echo(f"{c.id:22} {c.because}{gpu}")


@app.command()
def version() -> None:
    """Print pitstop's version."""
    from pitstop.version import __version__

    typer.echo(__version__)


@app.command()
def attach(
    pid: Annotated[int, typer.Argument(help="The trainer's PID, or its launcher's (torchrun, accelerate).")],
    for_: Annotated[str, typer.Option("--for", help="How long to sample (e.g. 30s, 2m).")] = "30s",
    rate: Annotated[float, typer.Option("--rate", help="Samples per second per thread.")] = 100.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help=f"Write the diagnosis as JSON ({schemas.RUN}).")
    ] = None,
    sample: Annotated[
        bool,
        typer.Option("--sample", help="Sample the stacks even where the full probe could be armed (3.14+)."),
    ] = False,
) -> None:
    """Diagnose a job that is already running, without restarting it. On Python 3.14+ pitstop's probe is
    armed in the job for the window by sys.remote_exec (PEP 768) and removed after it; elsewhere (or where
    remote debugging is off, said why) its stacks are sampled from outside (py-spy, non-blocking).

    pitstop attach 12345 --for 60s --json now.json
    """
    from pitstop.cli.attach import MAX_RATE, parse_window, run_attach

    try:
        if not 1.0 <= rate <= MAX_RATE:
            raise UserError(f"--rate: between 1 and {MAX_RATE:g} samples per second")
        code = run_attach(pid, parse_window(for_), rate, json_out, sample)
    except UserError as exc:
        raise fail(str(exc), exc.code) from None
    raise typer.Exit(code)


app.add_typer(history_app, name="history")
app.add_typer(data_app, name="data")


# libraries pitstop's own process imports (transformers pulls in peft, peft bitsandbytes) that log at import
# time about optional parts they could not load: a warning of theirs is not pitstop's output
QUIET_ON_IMPORT = ("bitsandbytes",)


def main() -> None:
    from pitstop.report.untrusted import shown

    for name in QUIET_ON_IMPORT:  # this process is pitstop's; the job's own process is left as it is
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        app()
    except KeyboardInterrupt:
        typer.secho("pitstop: interrupted", err=True, fg="red")
        sys.exit(130)
    except PitstopError as exc:
        typer.secho(f"pitstop: {shown(exc)}", err=True, fg="red")
        sys.exit(exc.code)
    except Exception as exc:  # a bug in pitstop: one line, unless asked for the traceback
        if os.environ.get("PITSTOP_DEBUG"):
            raise
        typer.secho(
            f"pitstop: internal error: {type(exc).__name__}: {shown(exc, one_line=True)} "
            "(PITSTOP_DEBUG=1 shows more)",
            err=True,
            fg="red",
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
