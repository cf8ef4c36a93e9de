"""Communication per optimizer step for a world size, a sharding strategy and the links between GPUs.

Why: on many GPUs a step is compute plus whatever communication compute does not hide, and the sharding
strategy sets how many bytes move. The volumes are the standard ones (ring collectives, nccl-tests' bus
bandwidth convention): a collective over ``n`` ranks of a tensor of ``S`` bytes puts ``f · S`` bytes through
each GPU's link, ``f = 2(n−1)/n`` for an all-reduce and ``(n−1)/n`` for an all-gather or a reduce-scatter,
and takes ``f · S / busbw``, with busbw 80% of the link's rate (``interconnect.ACHIEVABLE``).

* DDP (ZeRO-0, NO_SHARD), ZeRO-1/2, SHARD_GRAD_OP: the gradients are all-reduced once (ZeRO-1/2 and
  SHARD_GRAD_OP reduce-scatter them and all-gather the parameters: the same 2(n−1)/n).
* ZeRO-3 / FULL_SHARD: parameters all-gathered for the forward and again for the backward, gradients
  reduce-scattered: ≈ 3(n−1)/n × the parameter bytes.
* HYBRID_SHARD: FULL_SHARD inside a node (all-gathers and reduce-scatter over NVLink / PCIe), then the
  node's gradient shard all-reduced across nodes (``2(N−1)/N · S/g`` for N nodes of g GPUs).
  HYBRID_SHARD_ZERO2: the same with one all-gather inside the node.
* ZeRO++ hpZ (``zero_hpz_partition_size`` = GPUs per node): the forward's all-gather still spans every GPU,
  the backward's stays inside the node (a secondary copy of the shard is kept there), gradients are
  reduce-scattered over every GPU.
* LoRA / QLoRA: only the trainable parameters' gradients are reduced; sharded frozen weights are still
  gathered. Gradients are counted in the bytes the planner's memory model holds them in.

A collective that spans nodes runs at the network's rate (one NIC per GPU assumed, as
``interconnect.transport`` does); one inside a node at the GPU's NVLink generation, else its PCIe slot.
With gradient accumulation, DDP / ZeRO-0/1 reduce once per optimizer step (``no_sync``), sharded gradients
(ZeRO-2/3, FSDP) every micro-batch; FSDP and ZeRO-3 gather parameters every micro-batch, ZeRO-2 once a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pitstop.core.vocabulary import Sharding
from pitstop.hardware import GpuSpec
from pitstop.interconnect import LINKS, NVLINK_OF_GPU, Link
from pitstop.plan.memory import Setup

DEFAULT_NETWORK = "ib_ndr"  # interconnect.transport's assumption between nodes: one 400 Gb/s NIC per GPU
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"


@dataclass(frozen=True)
class Collective:
    """One kind of collective of a step: what it moves, over which ranks and link, how often."""

    what: str
    op: str
    ranks: int
    tensor_bytes: float  # the whole tensor the collective is about (S)
    link: Link
    per_step: int  # how many times it runs per optimizer step

    @property
    def bus_bytes(self) -> float:
        """Bytes through each GPU's link per optimizer step (nccl-tests' bus convention)."""
        n = self.ranks
        factor = 2.0 * (n - 1) / n if self.op == ALL_REDUCE else (n - 1) / n
        return factor * self.tensor_bytes * self.per_step

    @property
    def seconds(self) -> float:
        return self.bus_bytes / (self.link.expected_busbw_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "op": self.op,
            "ranks": self.ranks,
            "link": self.link.key,
            "per_step": self.per_step,
            "gb_on_the_bus": round(self.bus_bytes / 1e9, 3),
            "s": round(self.seconds, 4),
        }


@dataclass(frozen=True)
class CommPlan:
    """Every collective of one optimizer step under one strategy, with the links they run on."""

    strategy: str
    gpus: int
    nodes: int
    intra: Link
    inter: Link | None
    collectives: tuple[Collective, ...]

    @property
    def bus_bytes(self) -> float:
        return sum(c.bus_bytes for c in self.collectives)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def network_bytes(self) -> float:
        """Bus bytes of the collectives that cross nodes (on the network's link)."""
        if self.nodes <= 1 or self.inter is None:
            return 0.0
        return sum(c.bus_bytes for c in self.collectives if c.link is self.inter)

    @property
    def gradient_seconds(self) -> float:
        """The gradient reductions' share: what DDP-style buckets can overlap with the backward."""
        return sum(c.seconds for c in self.collectives if c.op != ALL_GATHER)


def strategy_of(zero: int, sharding: Sharding | str | None = None, hpz: int = 1) -> str:
    """The communication pattern's name: an FSDP strategy, or ZeRO's stage (with hpZ) mapped onto one."""
    if sharding:
        return str(Sharding(sharding))
    if zero >= 3:
        return "zero3_hpz" if hpz > 1 else str(Sharding.FULL_SHARD)
    return str(Sharding.NO_SHARD) if zero == 0 else f"zero{zero}"


def intra_link(gpu: GpuSpec) -> Link:
    """The link between GPUs of one node: the NVLink generation of SXM parts, else the GPU's PCIe slot."""
    key = gpu.key.upper()
    model = next((m for m in NVLINK_OF_GPU if m in key), None)
    if model is not None and "PCIE" not in key:
        return LINKS[NVLINK_OF_GPU[model]]
    return LINKS[f"pcie{gpu.pcie_gen}"]


def comm_per_step(
    strategy: str,
    weight_bytes: float,
    grad_bytes: float,
    gpus: int,
    nodes: int,
    intra: Link,
    inter: Link | None,
    accumulation: int = 1,
) -> CommPlan:
    """The collectives of one optimizer step (module doc for the volumes); no collective on one GPU."""
    g = max(gpus // max(nodes, 1), 1)
    wide = inter if nodes > 1 and inter is not None else intra  # a collective over every GPU
    a = max(accumulation, 1)
    out: list[Collective] = []
    if gpus <= 1:
        return CommPlan(strategy, gpus, nodes, intra, inter, ())
    if strategy in ("no_shard", "zero1"):
        out.append(Collective("gradient all-reduce", ALL_REDUCE, gpus, grad_bytes, wide, 1))
    elif strategy in ("zero2", "shard_grad_op"):
        # ZeRO-2 gathers the updated parameters once per step; SHARD_GRAD_OP gathers them for every forward
        gathers = a if strategy == "shard_grad_op" else 1
        out.append(Collective("gradient reduce-scatter", REDUCE_SCATTER, gpus, grad_bytes, wide, a))
        out.append(Collective("parameter all-gather", ALL_GATHER, gpus, weight_bytes, wide, gathers))
    elif strategy == "full_shard":
        out.append(Collective("parameter all-gather, forward", ALL_GATHER, gpus, weight_bytes, wide, a))
        out.append(Collective("parameter all-gather, backward", ALL_GATHER, gpus, weight_bytes, wide, a))
        out.append(Collective("gradient reduce-scatter", REDUCE_SCATTER, gpus, grad_bytes, wide, a))
    elif strategy == "zero3_hpz":
        out.append(Collective("parameter all-gather, forward", ALL_GATHER, gpus, weight_bytes, wide, a))
        out.append(
            Collective("parameter all-gather, backward (in the node)", ALL_GATHER, g, weight_bytes, intra, a)
        )
        out.append(Collective("gradient reduce-scatter", REDUCE_SCATTER, gpus, grad_bytes, wide, a))
    elif strategy in ("hybrid_shard", "hybrid_shard_zero2"):
        passes = ("forward", "backward") if strategy == "hybrid_shard" else ("forward",)
        for when in passes:
            name = f"parameter all-gather, {when} (in the node)"
            out.append(Collective(name, ALL_GATHER, g, weight_bytes, intra, a))
        out.append(
            Collective("gradient reduce-scatter (in the node)", REDUCE_SCATTER, g, grad_bytes, intra, a)
        )
        if nodes > 1 and inter is not None:
            name = "gradient shard all-reduce (across nodes)"
            out.append(Collective(name, ALL_REDUCE, nodes, grad_bytes / g, inter, a))
    else:
        raise ValueError(f"unknown communication strategy {strategy!r}")
    return CommPlan(strategy, gpus, nodes, intra, inter, tuple(c for c in out if c.ranks > 1))


def model_bytes(s: Setup) -> tuple[float, float]:
    """(parameter bytes a gather moves, gradient bytes a reduction moves) in the memory model's dtypes:
    bf16 weights and gradients; LoRA adapters and their gradients in fp32; QLoRA's base in 4 bits."""
    t = float(s.trainable_params)
    if s.method == "full":
        return 2.0 * s.total_params, 2.0 * t
    frozen = float(s.total_params) - t
    base = frozen * (0.5 * 1.03 if s.method == "qlora" else 2.0)
    return base + 4.0 * t, 4.0 * t


def setup_comm(s: Setup, gpu: GpuSpec, nodes: int, network: Link | None, accumulation: int = 1) -> CommPlan:
    """The communication of a planned setup (its ZeRO stage or FSDP strategy, its GPUs over ``nodes``)."""
    weights, grads = model_bytes(s)
    strategy = strategy_of(s.zero, s.sharding, s.hpz)
    inter = network or LINKS[DEFAULT_NETWORK]
    return comm_per_step(strategy, weights, grads, s.gpus, nodes, intra_link(gpu), inter, accumulation)


def sharding_options(s: Setup) -> list[tuple[str, Setup]]:
    """The strategies a user could pick for this setup's GPUs, each as the setup that would run it."""
    from dataclasses import replace

    base = replace(s, offload="none", hpz=1)
    options = [
        ("no_shard", replace(base, zero=0, sharding=None)),
        ("zero2", replace(base, zero=2, sharding=None)),
        ("shard_grad_op", replace(base, zero=2, sharding=str(Sharding.SHARD_GRAD_OP))),
        ("full_shard", replace(base, zero=3, sharding=str(Sharding.FULL_SHARD))),
    ]
    if s.nodes > 1:
        g = max(s.gpus // s.nodes, 1)
        options += [
            ("hybrid_shard_zero2", replace(base, zero=2, sharding=str(Sharding.HYBRID_SHARD_ZERO2))),
            ("hybrid_shard", replace(base, zero=3, sharding=str(Sharding.HYBRID_SHARD))),
            ("zero3_hpz", replace(base, zero=3, sharding=None, hpz=g)),
        ]
    return options


def backward_share(s: Setup) -> float:
    """The backward's share of a step's FLOPs: 4 of 6 FLOPs per parameter when every weight trains, 2 of 4
    when the base is frozen (no weight gradients)."""
    return 2.0 / 3.0 if s.method == "full" else 0.5


def communication(
    s: Setup,
    gpu: GpuSpec,
    flops_per_token: float,
    network: Link | None = None,
    accumulation: int = 1,
    mfu: float | None = None,
) -> dict[str, Any] | None:
    """What ``pitstop plan`` shows about communication: the step's collectives, their time beside the compute
    time the FLOPs model expects at ``mfu`` (the middle of ``plan/rate.py``'s range; 45% when not given),
    what overlap can hide at best, and every sharding option's memory and communication. None on one GPU."""
    from pitstop.hardware import EXPECTED_MFU
    from pitstop.plan.memory import GIB, memory

    mfu = mfu or sum(EXPECTED_MFU) / 2

    if s.gpus <= 1:
        return None
    a = max(accumulation, 1)
    cp = setup_comm(s, gpu, s.nodes, network, a)
    peak = gpu.peak_flops("bf16") or gpu.peak_flops("fp16") or gpu.peak_flops("fp32") or 1.0
    compute_s = s.micro_batch * s.seq * a * flops_per_token / (peak * mfu)
    backward_s = compute_s * backward_share(s)
    if cp.strategy in ("no_shard", "zero1", "zero2"):  # buckets overlap the gradient reductions with backward
        exposed = max(cp.gradient_seconds - backward_s, 0.0) + (cp.seconds - cp.gradient_seconds)
    else:  # FSDP / ZeRO-3 prefetch the next gather during compute
        exposed = max(cp.seconds - compute_s, 0.0)
    links = {cp.intra.key: round(cp.intra.expected_busbw_gbps, 1)}
    if cp.inter is not None and s.nodes > 1:
        links[cp.inter.key] = round(cp.inter.expected_busbw_gbps, 1)
    gpu_bytes = float(gpu.memory_bytes)
    options = []
    for strategy, changed in sharding_options(s):
        total = memory(changed, gpu_bytes).total
        other = setup_comm(changed, gpu, s.nodes, network, a)
        options.append(
            {
                "strategy": strategy,
                "memory_gib": round(total / GIB, 2),
                "fits": total <= gpu_bytes,
                "gb_on_the_bus": round(other.bus_bytes / 1e9, 3),
                "gb_across_nodes": round(other.network_bytes / 1e9, 3),
                "comm_s": round(other.seconds, 4),
            }
        )
    return {
        "strategy": cp.strategy,
        "nodes": s.nodes,
        "gpus_per_node": max(s.gpus // s.nodes, 1),
        "links_busbw_gbps": links,
        "accumulation": a,
        "collectives": [c.to_dict() for c in cp.collectives],
        "gb_on_the_bus_per_step": round(cp.bus_bytes / 1e9, 3),
        "gb_across_nodes_per_step": round(cp.network_bytes / 1e9, 3),
        "comm_s_per_step": round(cp.seconds, 4),
        "compute_s_per_step": round(compute_s, 4),
        "backward_s_per_step": round(backward_s, 4),
        "comm_share_if_not_hidden": round(cp.seconds / (cp.seconds + compute_s), 3),
        "exposed_s_at_best": round(exposed, 4),
        "options": options,
        "basis": (
            "ring collectives at 80% of each link's rate (nccl-tests bus bandwidth); compute at "
            f"{mfu:.0%} MFU; overlap hides gradient reductions behind the backward "
            "(DDP / ZeRO-1/2 buckets) or gathers behind compute (FSDP / ZeRO-3 prefetch) at best"
        ),
    }
