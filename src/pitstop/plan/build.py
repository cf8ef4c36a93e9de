"""Planning a named model on a named GPU: resolve both, count parameters, make the plan, cross-check it.

The orchestration ``pitstop plan`` runs; the CLI only parses arguments and renders the result. Every
failure here is a ``PitstopError`` said in one line (unknown GPU, unreadable config, impossible setup).
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.vocabulary import Sharding
from pitstop.errors import PitstopError
from pitstop.hardware import GPUS, lookup_gpu
from pitstop.interconnect import LINKS
from pitstop.plan.comm import DEFAULT_NETWORK
from pitstop.plan.memory import Setup
from pitstop.plan.model_shape import ModelConfigError, model_info_from_config
from pitstop.plan.params import count_params, resolve_model
from pitstop.plan.planner import Plan, PlanError, make_plan, model_info


@dataclass(frozen=True)
class PlanRequest:
    """What ``pitstop plan`` was asked: the model, the hardware and the training choices."""

    model: str
    gpu: str = "H100-SXM"
    gpus: int = 1
    seq: int = 2048
    micro_batch: str = "1"  # a number, or "auto": the largest that fits
    global_batch: int | None = None
    zero: int = 0
    offload: str = "none"
    method: str = "full"
    rank: int = 16
    optimizer: str = "adamw"
    attn: str = "sdpa"
    checkpointing: bool = False
    chunked_loss: bool = False
    simulate: bool = False
    nodes: int = 1
    sharding: str | None = None  # an FSDP strategy (vocabulary.Sharding); None: --zero says
    hpz: int = 1  # DeepSpeed ZeRO++ zero_hpz_partition_size
    network: str = DEFAULT_NETWORK  # the link between nodes (interconnect.LINKS)


# The most each count may be: far past any real job, yet small enough that every product the plan forms
# stays an exact integer and a readable figure (a 23-digit --seq used to print a plan of absurd numbers).
LIMITS: dict[str, tuple[str, int, str]] = {
    "seq": ("--seq", 2**25, "tokens per row; the longest released context is 10M"),
    "micro_batch": ("--micro-batch", 2**20, "rows per GPU per step"),
    "global_batch": ("--global-batch", 2**32, "rows per optimizer step"),
    "gpus": ("--gpus", 2**20, "GPUs in the job"),
    "nodes": ("--nodes", 2**20, "nodes"),
    "hpz": ("--hpz", 2**20, "GPUs per ZeRO++ partition"),
    "rank": ("--rank", 2**16, "LoRA rank; past any model's hidden size"),
}


SIMULATED_TOKENS_MAX = 2**32  # tokens per micro-batch --simulate covers


def _micro_batch(text: str) -> int | None:
    """``--micro-batch`` as a count (ASCII digits only: ``int`` refuses '²', which ``isdigit`` lets by),
    or ``None`` for auto."""
    if text == "auto":
        return None
    if not (text.isascii() and text.isdigit()):
        raise PlanError("--micro-batch is a number or auto")
    return int(text)


def check_bounds(r: PlanRequest) -> None:
    """One line, exit 2, for a count outside what any job has (checked before the model is read)."""
    values = {name: getattr(r, name) for name in LIMITS} | {"micro_batch": _micro_batch(r.micro_batch)}
    for name, (flag, most, what) in LIMITS.items():
        value = values[name]
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise PlanError(f"{flag} is a whole number ({what}), not {str(value)[:40]!r}")
        if not 1 <= value <= most:
            shown = f"{str(value)[:12]}… ({len(str(value))} digits)" if len(str(value)) > 15 else str(value)
            raise PlanError(f"{flag} {shown}: from 1 to {most:,} ({what})")


def build_plan(request: PlanRequest) -> Plan:
    """The plan for a request; raises PlanError / ModelConfigError with one line on bad input."""
    r = request
    check_bounds(r)
    spec = lookup_gpu(r.gpu)
    if spec is None:
        raise PlanError(f"unknown GPU '{r.gpu}'; pitstop knows: {', '.join(g.key for g in GPUS)}")
    try:
        name, config = resolve_model(r.model)
        shape = model_info_from_config(config)
    except (ModelConfigError, KeyError, TypeError, ValueError) as exc:
        raise ModelConfigError(f"--model: {exc or f'{r.model}: the config misses fields'}") from None
    micro_batch = _micro_batch(r.micro_batch)
    auto = micro_batch is None
    zero, sharding = _sharding(r)
    params = count_params(config, r.method, r.rank)
    lora = params.trainable if r.method != "full" else count_params(config, "lora", r.rank).trainable
    setup = Setup(
        model=model_info(params, shape),
        lora_params=lora,
        largest_module=params.largest_module,
        seq=r.seq,
        micro_batch=1 if micro_batch is None else micro_batch,
        gpus=r.gpus,
        zero=zero,
        sharding=sharding,
        nodes=r.nodes,
        hpz=r.hpz,
        offload=r.offload,
        method=r.method,
        optimizer=r.optimizer,
        attn=r.attn,
        checkpointing=r.checkpointing,
        chunked_loss=r.chunked_loss,
        lora_rank=r.rank,
    )
    network = LINKS.get(r.network)
    if network is None:
        raise PlanError(f"unknown --network '{r.network}'; pitstop knows: {', '.join(LINKS)}")
    plan = make_plan(name, spec, setup, params, r.global_batch, auto, network)
    if r.simulate:
        _cross_check(plan, config, r)
    return plan


def _sharding(r: PlanRequest) -> tuple[int, str | None]:
    """(ZeRO stage whose memory applies, FSDP strategy): --sharding is FSDP's word, --zero DeepSpeed's."""
    if r.sharding is None:
        return r.zero, None
    strategy = Sharding.parse(r.sharding)
    if strategy is None:
        raise PlanError(f"--sharding is one of {', '.join(str(v) for v in Sharding)}")
    if r.zero not in (0, strategy.zero_stage):
        raise PlanError("--zero is DeepSpeed's and --sharding FSDP's: give one of them")
    return strategy.zero_stage, str(strategy)


def _cross_check(plan: Plan, config: dict[str, object], r: PlanRequest) -> None:
    """Simulate one step on fake tensors beside the formula; its failure is a note, never an error."""
    tokens = plan.setup.micro_batch * r.seq
    if tokens > SIMULATED_TOKENS_MAX:  # torch's sizes overflow (and it logs a traceback) past about 2**40
        plan.notes.append(
            f"not simulated on fake tensors: {tokens:,} tokens per micro-batch is past the "
            f"{SIMULATED_TOKENS_MAX:,} a simulation covers; the figures are the formula's"
        )
        return
    try:
        from pitstop.plan.simulate import simulate_step

        sim = simulate_step(
            config,
            plan.setup.micro_batch,
            r.seq,
            "eager" if r.attn == "eager" else "sdpa",
            r.checkpointing,
            None,  # peft cannot wrap a model under fake tensors: LoRA is simulated without its adapters
        )
        plan.simulated_activations = sim.activations
        if r.method != "full":
            plan.notes.append(
                "simulated without the LoRA adapters (peft cannot wrap fake tensors); they add "
                f"{2 * r.rank * 7} bytes per token per layer to the formula"
            )
    except PitstopError:
        raise
    except Exception as exc:  # the simulation is a cross-check; its failure must not hide the plan
        plan.notes.append(f"fake-tensor simulation unavailable ({type(exc).__name__}: {str(exc)[:120]})")
