"""The machine's links cap the job: GPUs that talk over PCIe (no NVLink), a PCIe link running below its
generation or width, NVLinks down, NCCL through host memory (SHM) where P2P works, nodes joined by TCP sockets.

No setting makes a PCIe box an NVLink one: what the user needs is the ceiling in numbers before buying more GPUs —
the bus bandwidth these links allow (``interconnect.ceiling``: a measured link beats an assumed one), the
communication each step needs at it (timed collectives' bytes, else ``plan/comm``'s model of the gradient or
shard traffic), and what N GPUs can give over one at most: ``N × compute / max(compute, communication)`` with
all communication hidden, ``N × compute / (compute + communication)`` with none.

The links come from ``Environment.links``: NVML (read by the probe at the window's end), ``nvidia-smi topo -m``
and ``nvlink -s`` and NCCL's own init log (``pitstop analyze``; ``doctor`` / ``watch`` ask NCCL to write it).
Without them the GPU's name says only whether it is a PCIe card: the same finding at a lower confidence.
``communication_bound`` measures the symptom; where this rule's limit holds it names it as the reason."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.findings import Finding, Use, use
from pitstop.core.profile import Topology
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.ranks import bus_factor
from pitstop.interconnect import NVLINK_OF_GPU, Ceiling, Fault, ceiling, scaling_bound
from pitstop.remedies import advise

MIN_COMM_SHARE = 0.10  # exposed communication at least this share of a step: the links cost real time
MIN_PLANNED_COMM_S = 0.05  # no step measured: the plan's communication per step at the ceiling at least this
MEASURED_CONFIDENCE = 0.85  # the links read (NVML, nvidia-smi, NCCL's log) and the communication timed
READ_CONFIDENCE = 0.7  # the links read, the communication not timed (an artifact of the machine alone)
ASSUMED_CONFIDENCE = 0.45  # no link read: a PCIe card by its name, the communication timed
PLANNED_CONFIDENCE = 0.4  # no step measured: the plan's traffic for the model against the read link
# which fault the finding leads with when several hold: the one that costs the most bandwidth first
FAULT_ORDER = (Fault.SOCKET, Fault.SHM, Fault.NVLINK_DOWN, Fault.PCIE_WIDTH, Fault.PCIE_GEN)
TRANSPORT_FAULTS = (
    Fault.SOCKET,
    Fault.SHM,
)  # fix_transport's: a setting or a driver brings the fast path back


@dataclass(frozen=True)
class LinkLimit:
    """What the links allow and what the job needs of them: slow_links' finding, communication_bound's reason."""

    ceiling: Ceiling
    reason: str  # a Fault's value, or "pcie_only"
    gpus: int
    gpus_from: str
    nodes: int
    exposed: float | None  # exposed communication's share of a step, where timed
    busbw_measured: float | None
    bus_bytes: float | None  # bytes through each GPU's link per optimizer step
    bytes_from: str | None
    compute_s: float | None

    @property
    def comm_s(self) -> float | None:
        """Communication per step at the ceiling's bus bandwidth."""
        if self.bus_bytes is None:
            return None
        return self.bus_bytes / (self.ceiling.busbw_gbps * 1e9)


def topology_of(ctx: RuleContext) -> Topology | None:
    """The run's links: the profile's environment's, else the first rank's that has them (another node)."""
    if ctx.env.links is not None:
        return ctx.env.links
    return next((r.environment.links for r in ctx.profile.ranks if r.environment.links is not None), None)


def _assumed(ctx: RuleContext) -> Ceiling | None:
    """No link read: a PCIe card by its name (a known GPU without an NVLink generation), else nothing."""
    from pitstop.hardware import lookup_gpu
    from pitstop.interconnect import pcie_link

    name = (ctx.env.gpu_name or "").upper()
    spec = lookup_gpu(ctx.env.gpu_name)
    if spec is None or ((ctx.env.nodes or 1) > 1):
        return None
    if any(model in name for model in NVLINK_OF_GPU) and "PCIE" not in name:
        return None
    link = pcie_link(spec.pcie_gen)
    return Ceiling(link, "pcie", False, f"{spec.key} is a PCIe card: {link.source} assumed, no link read")


def _gpus(ctx: RuleContext, topology: Topology | None) -> tuple[int, str]:
    world = ctx.profile.world_size
    if world > 1 or topology is None:
        return world, "the job's ranks"
    if topology.nccl_ranks:
        return topology.nccl_ranks, "NCCL's communicator"
    return len(topology.gpus) or len({p.a for p in topology.pairs} | {p.b for p in topology.pairs}), (
        "every GPU of the machine read (the job's count not known)"
    )


def _measured(ctx: RuleContext, gpus: int) -> tuple[float | None, float | None, float | None, float | None]:
    """(exposed share, measured bus bandwidth, bus bytes per step, compute seconds per step) from timed
    collectives, else a trace's NCCL time; None where not measured."""
    a = ctx.ranks
    if a is not None and a.step_s > 0:
        exposed = max(0.0, a.mean_frac("comm_s") - a.mean_frac("small_comm_s"))
        main = max(a.bandwidth, key=lambda b: b.bytes_per_step, default=None)
        bus = sum(b.bytes_per_step * bus_factor(b.op, gpus) for b in a.bandwidth) or None
        busbw = main.busbw_gbps if main is not None else None
        return exposed, busbw, bus, a.step_s * (1 - exposed)
    rows = [
        (t.exposed_comm_ms if t.exposed_comm_ms is not None else t.nccl_ms * (1 - t.nccl_overlap_frac), step)
        for r, t in ctx.traced
        if (step := 1000 * (r.mean_step_s or 0.0)) and t.nccl_ms and t.nccl_overlap_frac is not None
    ]
    if not rows:
        return None, None, None, None
    exposed = max(ms / step for ms, step in rows)
    step_s = max(step for _, step in rows) / 1000
    busbws = [t.bus_bandwidth_gbps for t in ctx.traces if t.bus_bandwidth_gbps]
    return exposed, (min(busbws) if busbws else None), None, step_s * (1 - exposed)


def _planned_bytes(ctx: RuleContext, gpus: int, nodes: int, c: Ceiling) -> float | None:
    """The plan's bytes through each GPU's link per optimizer step for the run's model and sharding."""
    from pitstop.plan.comm import comm_per_step, model_bytes, strategy_of
    from pitstop.plan.from_run import setup_for_run

    s = setup_for_run(ctx.env, gpus=gpus)
    if s is None or gpus < 2:
        return None
    weights, grads = model_bytes(s)
    strategy = strategy_of(s.zero, s.sharding, s.hpz)
    accumulation = max(ctx.env.grad_accum_steps or 1, 1)
    plan = comm_per_step(strategy, weights, grads, gpus, max(nodes, 1), c.link, c.link, accumulation)
    return plan.bus_bytes or None


def link_limit(ctx: RuleContext) -> LinkLimit | None:
    """The links' limit on this run, or None: one GPU, CPU / gloo runs, NVLink and InfiniBand without faults."""
    env = ctx.env
    if env.device == Device.CPU or env.dist_backend == "gloo" or env.device == Device.ROCM:
        return None
    topology = topology_of(ctx)
    gpus, gpus_from = _gpus(ctx, topology)
    nodes = (topology.nccl_nodes if topology else None) or env.nodes or 1
    c = ceiling(topology, env.gpu_name, nodes) or _assumed(ctx)
    if c is None or gpus < 2:
        return None
    faults = [f for f in FAULT_ORDER if f in c.faults]
    if faults:
        reason = str(faults[0])
    elif c.kind in ("pcie", "pcie_sys"):
        reason = "pcie_only"
    else:
        return None
    exposed, busbw, bus, compute = _measured(ctx, gpus)
    bytes_from = "timed collectives' bytes" if bus is not None else None
    if bus is None:
        bus = _planned_bytes(ctx, gpus, nodes, c)
        bytes_from = "plan/comm: the model's gradient / shard traffic for its sharding" if bus else None
    limit = LinkLimit(c, reason, gpus, gpus_from, nodes, exposed, busbw, bus, bytes_from, compute)
    if reason != "pcie_only":
        return limit
    if exposed is not None:
        return limit if exposed >= MIN_COMM_SHARE else None
    return limit if (limit.comm_s or 0.0) >= MIN_PLANNED_COMM_S and c.measured else None


@cause(
    CauseId.SLOW_LINKS,
    title="The links between GPUs or nodes cap the job",
    because=(
        "a PCIe-only or badly linked machine: GPUs without NVLink, a PCIe link below its generation or width, "
        "NVLinks down, NCCL through host memory where P2P works, nodes over TCP sockets instead of InfiniBand; "
        "the interconnect, not a setting, limits what more GPUs give"
    ),
    needs_gpu=True,
    needs=(Evidence.COLLECTIVES,),
    fires_when=(
        "links read (NVML, nvidia-smi topo -m / nvlink -s, NCCL's init log) show a fault: NET/Socket between "
        "nodes, SHM where P2P works, inactive NVLinks, a PCIe width below its maximum, or a generation below it "
        "under load; or GPUs without NVLink while exposed communication takes ≥ {MIN_COMM_SHARE:.0%} of a step "
        "(no step measured: the plan's communication ≥ {MIN_PLANNED_COMM_S} s per step on the read links). "
        "Confidence {MEASURED_CONFIDENCE} with the links read and communication timed, {READ_CONFIDENCE} read only, "
        "{ASSUMED_CONFIDENCE} from a PCIe card's name, {PLANNED_CONFIDENCE} from the plan"
    ),
    estimate=(
        "a fault: the exposed communication shrinks by the healthy link's rate over the running one; PCIe-only: "
        "at most 1/(1 − exposed share) when the communication is hidden or removed; the ceiling N × compute / "
        "max(compute, communication at the link's bus bandwidth) is evidence, not the estimate"
    ),
    remedies=(RemedyId.COMMUNICATE_LESS, RemedyId.FIX_TRANSPORT),
)
def slow_links(ctx: RuleContext) -> Finding | None:
    limit = link_limit(ctx)
    if limit is None:
        return None
    c = limit.ceiling
    evidence = _evidence(ctx, limit)
    est, basis = _estimate(limit)
    return Finding(
        cause=CauseId.SLOW_LINKS,
        severity=_severity(limit),
        confidence=_confidence(limit),
        summary=_summary(limit),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, *_uses(ctx, limit, c)),
    )


def _evidence(ctx: RuleContext, limit: LinkLimit) -> dict[str, object]:
    c = limit.ceiling
    topology = topology_of(ctx)
    evidence: dict[str, object] = {
        "reason": limit.reason,
        "link": c.link.key,
        "link_kind": c.kind,
        "link_gbps": round(c.link.gbps, 2),
        "ceiling_busbw_gbps": round(c.busbw_gbps, 1),
        "link_basis": c.basis,
        "links_read": c.measured,
        "gpus": limit.gpus,
        "gpus_from": limit.gpus_from,
    }
    if c.fault_notes:
        evidence["faults"] = list(c.fault_notes)
    if c.healthy is not None and c.healthy.gbps > c.link.gbps:
        evidence["healthy_busbw_gbps"] = round(c.healthy.expected_busbw_gbps, 1)
    if topology is not None:
        evidence["sources"] = list(topology.sources)
        paths = sorted({str(p.path) + (str(p.nvlinks) if p.nvlinks else "") for p in topology.pairs})
        if paths:
            evidence["gpu_paths"] = paths
        if topology.nccl_intra or topology.nccl_inter:
            evidence["nccl_transports"] = topology.nccl_intra + topology.nccl_inter
        if topology.nccl_net:
            evidence["nccl_net"] = topology.nccl_net
    if limit.busbw_measured is not None:
        evidence["measured_busbw_gbps"] = round(limit.busbw_measured, 2)
    if limit.exposed is not None:
        evidence["exposed_frac_of_step"] = round(limit.exposed, 3)
    if limit.bus_bytes is not None and limit.comm_s is not None:
        evidence["gb_on_the_bus_per_step"] = round(limit.bus_bytes / 1e9, 3)
        evidence["bytes_from"] = limit.bytes_from
        evidence["comm_s_per_step_at_ceiling"] = round(limit.comm_s, 4)
        if limit.compute_s:
            at_most, no_overlap = scaling_bound(limit.gpus, limit.compute_s, limit.comm_s)
            evidence["compute_s_per_step"] = round(limit.compute_s, 4)
            evidence["scaling_at_most"] = round(at_most, 2)
            evidence["scaling_without_overlap"] = round(no_overlap, 2)
    return evidence


def _summary(limit: LinkLimit) -> str:
    c = limit.ceiling
    head = f"This box's all-reduce can reach ~{c.busbw_gbps:.0f} GB/s ({c.link.key}, {c.basis})"
    comm, moved = limit.comm_s, (limit.bus_bytes or 0.0) / 1e9
    if comm is not None and limit.compute_s:
        at_most, no_overlap = scaling_bound(limit.gpus, limit.compute_s, comm)
        head += (
            f", so {limit.gpus} GPUs give at most ×{at_most:.1f} over one here (×{no_overlap:.1f} if the "
            f"communication is not hidden): {moved:.2f} GB per step through each GPU's link takes "
            f"{comm * 1000:.0f} ms against {limit.compute_s * 1000:.0f} ms of compute"
        )
    elif comm is not None:
        head += (
            f": each optimizer step moves {moved:.2f} GB through each GPU's link, "
            f"{comm:.2f} s at that rate; {limit.gpus} GPUs scale only while a step computes longer than that"
        )
    if limit.reason == "pcie_only":
        return head + ". The interconnect, not a setting, is the limit."
    return head + f". The links run below what this machine has: {'; '.join(c.fault_notes)}."


def _estimate(limit: LinkLimit) -> tuple[float | None, str]:
    c = limit.ceiling
    if limit.exposed is None:
        return None, "not estimated: no step measured (the communication's share of a step is not known)"
    if limit.reason != "pcie_only" and c.healthy is not None and c.healthy.gbps > c.link.gbps:
        ratio = c.link.gbps / c.healthy.gbps
        return amdahl(limit.exposed, 1 / ratio), (
            f"timed collectives: {limit.exposed:.0%} of a step exposed, {ratio:.2f}× the time on the healthy "
            f"link ({c.healthy.key})"
        )
    return amdahl(limit.exposed, float("inf")), (
        f"timed collectives: {limit.exposed:.0%} of a step exposed; communicating less or hiding it gives at "
        "most 1/(1−f)"
    )


def _severity(limit: LinkLimit) -> Severity:
    if limit.exposed is not None:
        return severity_for(limit.exposed, 0.25, MIN_COMM_SHARE)
    return Severity.MEDIUM if limit.reason != "pcie_only" else Severity.LOW


def _confidence(limit: LinkLimit) -> float:
    if not limit.ceiling.measured:
        return ASSUMED_CONFIDENCE if limit.exposed is not None else PLANNED_CONFIDENCE
    if limit.exposed is not None:
        return MEASURED_CONFIDENCE
    return READ_CONFIDENCE if limit.reason != "pcie_only" else PLANNED_CONFIDENCE


def _uses(ctx: RuleContext, limit: LinkLimit, c: Ceiling) -> list[Use]:
    uses: list[Use] = []
    if limit.reason in TRANSPORT_FAULTS:
        uses.append(
            use(RemedyId.FIX_TRANSPORT, warnings=list(c.fault_notes), multi_node=limit.reason == Fault.SOCKET)
        )
    uses.append(
        use(
            RemedyId.COMMUNICATE_LESS,
            reason=limit.reason,
            busbw_gbps=round(c.busbw_gbps, 1),
            link=c.link.key,
            gpus=limit.gpus,
            nodes=limit.nodes,
            zero_stage=ctx.env.zero_stage,
            sharding=ctx.env.fsdp_sharding,
        )
    )
    return uses
