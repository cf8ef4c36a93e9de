"""Planning a named model on a named GPU: resolve both, count parameters, make the plan, cross-check it.

The orchestration ``pitstop plan`` runs; the CLI only parses arguments and renders the result. Every
failure here is a ``PitstopError`` said in one line (unknown GPU, unreadable config, impossible setup).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pitstop.core.vocabulary import Sharding
from pitstop.errors import PitstopError
from pitstop.hardware import GPUS, lookup_gpu
from pitstop.interconnect import LINKS
from pitstop.plan.comm import DEFAULT_NETWORK
from pitstop.plan.memory import GIB, Setup, memory
from pitstop.plan.model_shape import ModelConfigError, model_info_from_config, norm_kind, standard_keys
from pitstop.plan.params import count_params, resolve_model
from pitstop.plan.planner import Plan, PlanError, longest_sequence, make_plan, model_info, validate

DEFAULT_SEQ = 2048  # where --seq auto starts before the longest that fits is found


@dataclass(frozen=True)
class PlanRequest:
    """What ``pitstop plan`` was asked: the model, the hardware and the training choices."""

    model: str
    gpu: str = "H100-SXM"
    gpus: int = 1
    seq: int | str = 2048  # tokens per row, or "auto": the longest that fits
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
    # issue 44: the precision the states are kept in ("mixed": fp32 master + moments; "bf16": pure bf16)
    precision: str = "mixed"
    ac: str = "none"  # activation checkpointing: "none", "full", "selective" (``checkpointing`` = "full")
    ac_offload: bool = False  # activations offloaded to the host
    ac_every: int = 0  # --ac selective's per-N-layers form: every N-th layer checkpointed (0: op-level)
    optimizer_in_backward: bool = False  # the optimizer step fused into backward: no gradient buffer held
    frozen_reshard: bool = True  # False: FSDP1 keeps a LoRA base's frozen units gathered through backward
    double_quant: bool = True  # QLoRA: bitsandbytes' double quantization of the 4-bit block constants
    compile: bool = False  # torch.compile: a higher expected MFU
    power_limit_w: float | None = None  # a GPU capped below its board power: a derated peak


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


def _seq(value: int | str) -> int | None:
    """``--seq`` as a count, or ``None`` for auto (the longest sequence that fits)."""
    if value == "auto":
        return None
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise PlanError("--seq is a number or auto")
        return int(value)
    return value


def check_bounds(r: PlanRequest) -> None:
    """One line, exit 2, for a count outside what any job has (checked before the model is read)."""
    values = {name: getattr(r, name) for name in LIMITS} | {
        "micro_batch": _micro_batch(r.micro_batch),
        "seq": _seq(r.seq),
    }
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
    seq = _seq(r.seq)
    if seq is None and micro_batch_auto(r):
        raise PlanError("--seq auto and --micro-batch auto: fix one of them (the other is then found)")
    micro_batch = _micro_batch(r.micro_batch)
    auto = micro_batch is None
    zero, sharding = _sharding(r)
    params = count_params(config, r.method, r.rank)
    lora = params.trainable if r.method != "full" else count_params(config, "lora", r.rank).trainable
    setup = Setup(
        model=model_info(params, shape),
        lora_params=lora,
        largest_module=params.largest_module,
        seq=DEFAULT_SEQ if seq is None else seq,
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
        precision=r.precision,
        ac="none" if r.checkpointing and r.ac == "full" else r.ac,
        ac_every=r.ac_every,
        ac_offload=r.ac_offload,
        optimizer_in_backward=r.optimizer_in_backward,
        frozen_reshard=r.frozen_reshard,
        double_quant=r.double_quant,
        norm=norm_kind(shape.model_type, standard_keys(config.get("text_config") or config)),
    )
    network = LINKS.get(r.network)
    if network is None:
        raise PlanError(f"unknown --network '{r.network}'; pitstop knows: {', '.join(LINKS)}")
    if seq is None:
        setup = _longest_sequence(setup, spec.memory_bytes)
    plan = make_plan(
        name,
        spec,
        setup,
        params,
        r.global_batch,
        auto,
        network,
        compile=r.compile,
        power_limit_w=r.power_limit_w,
    )
    if seq is None:
        plan.max_seq = setup.seq
    if r.simulate:
        _cross_check(plan, config, r)
    return plan


def micro_batch_auto(r: PlanRequest) -> bool:
    return r.micro_batch == "auto"


def _longest_sequence(setup: Setup, gpu_bytes: float) -> Setup:
    """``--seq auto``: the setup at the longest sequence that fits (validated first, so a bad choice is
    said as itself rather than as "nothing fits")."""
    validate(setup)
    longest = longest_sequence(setup, float(gpu_bytes), LIMITS["seq"][1])
    if longest == 0:
        one = memory(replace(setup, seq=1), float(gpu_bytes))
        raise PlanError(
            f"--seq auto: not even one token per row fits at this micro-batch: at one token the plan needs "
            f"{one.total / GIB:.1f} GiB of the GPU's {gpu_bytes / GIB:.1f} (weights, gradients and optimizer "
            f"{(one.weights + one.gradients + one.optimizer + one.optimizer_step) / GIB:.1f}); "
            "see `pitstop plan` without --seq auto for the changes that save memory"
        )
    return replace(setup, seq=longest)


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
    tokens = plan.setup.micro_batch * plan.setup.seq
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
            plan.setup.seq,
            "eager" if r.attn == "eager" else "sdpa",
            plan.setup.ac_mode == "full",
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
