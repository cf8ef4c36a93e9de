"""Remedies: every change pitstop can advise, defined once (see ``base``).

Rules refer to remedies with parameters from the evidence (``use(RemedyId.WORKERS, workers=4, basis=...)``);
``advise`` turns those references into the Fix a Finding shows; tune walks ``REGISTRY`` for what it can try
and prints the kept change from the same ``advice``. Adding a cause with its fix = one rule + one module here.

``TUNE_ORDER`` is tune's order among the remedies of one cause (most promising first).
"""

from __future__ import annotations

from pitstop.findings import Fix, Use, use
from pitstop.remedies import (  # noqa: F401  (each module registers its remedy)
    attention,
    balance_ranks,
    bf16,
    bigger_buckets,
    compile_model,
    cpu_threads,
    eval_less_often,
    expandable_segments,
    fewer_syncs,
    fix_transport,
    fp16,
    fused_kernels,
    fused_optimizer,
    group_by_length,
    liger_kernels,
    lighter_sharding,
    manual_gc,
    micro_batch,
    nccl_backend,
    no_checkpointing,
    no_offload,
    no_sync_accumulation,
    overlap_comm,
    pack,
    pack_batch,
    pin_memory,
    pretokenize,
    save_less_often,
    tf32,
    trim_padding,
    unthrottle_gpu,
    use_every_gpu,
    workers,
)
from pitstop.remedies.base import REGISTRY, Advice, Remedy, TrialFacts
from pitstop.vocabulary import Framework, RemedyId

TUNE_ORDER: tuple[RemedyId, ...] = (
    RemedyId.ATTENTION,
    RemedyId.PRETOKENIZE,
    RemedyId.WORKERS,
    RemedyId.TRIM_PADDING,
    RemedyId.PACK_BATCH,
    RemedyId.PACK,
    RemedyId.GROUP_BY_LENGTH,
    RemedyId.MICRO_BATCH,
    RemedyId.BF16,
    RemedyId.FP16,
    RemedyId.TF32,
    RemedyId.NO_CHECKPOINTING,
    RemedyId.SAVE_LESS_OFTEN,
    RemedyId.CPU_THREADS,
    RemedyId.FUSED_OPTIMIZER,
    RemedyId.LIGER_KERNELS,
    RemedyId.COMPILE_MODEL,
    RemedyId.EXPANDABLE_SEGMENTS,
)


def _in_tune_order() -> None:
    """Registration follows import order, which tools may sort: put the registry in tune's order."""
    ordered = {rid: REGISTRY[rid] for rid in TUNE_ORDER}
    ordered.update({rid: r for rid, r in REGISTRY.items() if rid not in ordered})
    REGISTRY.clear()
    REGISTRY.update(ordered)


_in_tune_order()

__all__ = ["REGISTRY", "Advice", "Remedy", "RemedyId", "TrialFacts", "Use", "advise", "remedy", "use"]


def remedy(remedy_id: RemedyId | str) -> Remedy:
    """The registered remedy; an unknown id is a programming error (KeyError)."""
    return REGISTRY[RemedyId(remedy_id)]


def advise(framework: Framework | str | None, *uses: Use) -> Fix:
    """The Fix a Finding shows: each remedy's advice, in order, for the job's framework and for every
    framework a remedy writes its own snippet for (so a saved report serves whoever reads it)."""
    fw = Framework.of(framework)
    text = " ".join(remedy(u.remedy).advice(fw, u.params).text for u in uses)
    frameworks: list[Framework] = [Framework.PYTORCH]
    for u in uses:
        frameworks += [f for f in remedy(u.remedy).frameworks() if f not in frameworks]
    if fw not in frameworks:
        frameworks.append(fw)
    snippets = {
        str(f): "\n".join(remedy(u.remedy).advice(f, u.params).snippet for u in uses) for f in frameworks
    }
    return Fix(text=text, snippets=snippets, framework=str(fw), uses=tuple(uses))
