"""Debug and safety modes left on in a training run: autograd's anomaly detection (``set_detect_anomaly(True)``,
``detect_anomaly()``, Lightning's ``detect_anomaly=True``), ``CUDA_LAUNCH_BLOCKING=1``,
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` and deterministic algorithms. Each is meant for a debugging session and
costs every step; the live probe sees them (``RankProfile.debug_modes``); offline, a config that switches
anomaly detection on (Lightning's ``detect_anomaly: true``) or the warning torch logs when it is on
(``Environment.anomaly_detection``, from ``pitstop check`` / ``analyze``) is named with no estimate.

Anomaly detection records a Python stack for every autograd node in the forward and checks every gradient
for NaN in the backward, so its cost grows with the number of operations, not their size: the estimate takes
it as ``ANOMALY_SLOWDOWN``× on the compute share of the step. The settings are named with no estimate of their
own: their cost depends on the kernels and the collectives, and only switching them off measures it, which
``pitstop tune`` does: its ``debug_off`` trial keeps every mode off inside the job (``remedies/debug_off.py``)."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import DebugModes
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

ANOMALY_SHARE = 0.5  # share of the measured steps run with anomaly detection on, for a finding
ANOMALY_SLOWDOWN = 2.0
"""The compute of a step with anomaly detection on over the same without: measured ×2.0–2.5 on a CPU for a
4-layer Llama (hidden 128, 8 × 128 tokens, AdamW) and ×3.5–4.5 for a 2-layer one of hidden 64, 2026-12-06;
the cost is per autograd operation, so it weighs less on larger operations: the low end is taken, and the
estimate is a lower bound."""
CONFIG_CONFIDENCE = 0.5  # a config or a log line says it is on; nothing measured what it costs
GPU_ONLY = ("CUDA_LAUNCH_BLOCKING",)  # settings that cost nothing on a CPU run
DISTRIBUTED_ONLY = ("TORCH_DISTRIBUTED_DEBUG",)  # settings that cost nothing on one process


def _settings_that_cost(ctx: RuleContext, modes: DebugModes) -> list[str]:
    multi = (ctx.profile.world_size or 1) > 1
    kept = []
    for setting in modes.settings:
        name = setting.split("=", 1)[0]
        if (name in GPU_ONLY and ctx.env.device == Device.CPU) or (name in DISTRIBUTED_ONLY and not multi):
            continue
        kept.append(setting)
    return kept


@cause(
    CauseId.DEBUG_MODES,
    title="Debug modes left on",
    because=(
        "a debugging aid meant for one session runs on every step: autograd's anomaly detection, "
        "CUDA_LAUNCH_BLOCKING=1, TORCH_DISTRIBUTED_DEBUG=DETAIL, deterministic algorithms or a profiler left "
        "running"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe saw anomaly detection on in ≥ {ANOMALY_SHARE:.0%} of the measured steps (the job's line "
        "that switched it on named), or one of the slow settings where it costs: CUDA_LAUNCH_BLOCKING on a GPU, "
        "TORCH_DISTRIBUTED_DEBUG with several ranks, deterministic algorithms, or a profiler or tracer "
        "(torch.profiler / emit_nvtx, cProfile, sys.settrace) running as the window starts; offline, a config or torch's "
        "own log line that says anomaly detection is on"
    ),
    estimate=(
        "anomaly detection: the step's compute share taken {ANOMALY_SLOWDOWN:.0f}× faster without it (measured "
        "2.0–4.5× on a CPU, the more the smaller the operations: a lower bound); the settings alone, or a config "
        "that switches it on: not estimated (switching them off measures it)"
    ),
    remedies=(RemedyId.DEBUG_OFF,),
)
def debug_modes(ctx: RuleContext) -> Finding | None:
    ranks = [r for r in ctx.profile.ranks if r.debug_modes is not None and r.steps]
    if not ranks:
        return _configured(ctx)
    rank = max(ranks, key=lambda r: (r.debug_modes.anomaly_steps if r.debug_modes else 0, -r.rank))
    modes = rank.debug_modes
    assert modes is not None
    share = modes.anomaly_steps / len(rank.steps)
    anomaly = share >= ANOMALY_SHARE
    settings = _settings_that_cost(ctx, modes)
    running = list(modes.profilers)  # a profiler or tracer left running: it hooks every operation or call
    if not anomaly and not settings and not running:
        return None
    evidence: dict[str, object] = {
        "anomaly_detection_steps": modes.anomaly_steps,
        "steps_measured": len(rank.steps),
        "anomaly_site": modes.anomaly_site,
        "settings": settings,
        "profilers": running,
        "rank": rank.rank,
    }
    on = (["autograd's anomaly detection"] if anomaly else []) + settings + running
    summary = f"{' and '.join(on)} {'is' if len(on) == 1 else 'are'} on in the training loop"
    if anomaly:
        where = f", switched on at {modes.anomaly_site}" if modes.anomaly_site else ""
        summary += f" (anomaly detection in {modes.anomaly_steps} of {len(rank.steps)} measured steps{where})"
    summary += ": each is a debugging aid that slows every step."
    est: float | None = None
    basis = (
        "not estimated: what these settings and profilers cost depends on the kernels, the collectives and the "
        "Python the step runs; turning them off measures it"
    )
    if anomaly:
        c = ctx.compute_frac
        est = amdahl(c * share, ANOMALY_SLOWDOWN)
        basis = (
            f"anomaly detection taken as {ANOMALY_SLOWDOWN:.0f}× on the compute ({c:.0%} of the step) of the "
            f"{share:.0%} of steps it was on in (measured 2.0–4.5× for small Llamas on a CPU: a lower bound)"
        )
    return Finding(
        cause=CauseId.DEBUG_MODES,
        severity=severity_for(est, 1.25, 1.05) if est is not None else Severity.MEDIUM,
        confidence=0.95,  # the probe read the modes themselves; only their cost is assumed
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.DEBUG_OFF,
                anomaly=anomaly,
                site=modes.anomaly_site,
                settings=settings,
                profilers=running,
            ),
        ),
    )


def _configured(ctx: RuleContext) -> Finding | None:
    """Anomaly detection written in the run's config, or logged by torch, where no probe watched the job."""
    if ctx.env.anomaly_detection is not True:
        return None
    said = ctx.env.configured_by.get("anomaly_detection")
    return Finding(
        cause=CauseId.DEBUG_MODES,
        severity=Severity.MEDIUM,
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"Autograd's anomaly detection is on for training{f' ({said})' if said else ''}: it records a "
            "Python stack for every operation and checks every gradient, every step."
        ),
        evidence={
            "anomaly_detection": True,
            "configured_by": said,
            "config_sources": list(ctx.env.config_sources),
        },
        est_speedup=None,
        speedup_basis=(
            "not estimated: its cost is per autograd operation (measured ×2.0–4.5 on small CPU models); "
            "`pitstop doctor` on the job times the steps it runs in, and `pitstop tune` measures it off"
        ),
        fix=advise(ctx.framework, use(RemedyId.DEBUG_OFF, anomaly=True, site=None, settings=[])),
    )
