"""The fixes tune can try without editing the job, and which findings propose them.

Each candidate says whether it preserves what the model computes (same examples, same per-token losses up
to floating-point order) or changes it (batch composition, numerics); for the preserving ones tune compares
the first steps' losses with the baseline's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.diagnose import Diagnosis


@dataclass(frozen=True)
class Candidate:
    fix: str
    title: str
    preserves_computation: bool
    effect: str  # what it keeps or changes, one phrase
    gpu_only: bool = False
    exclusive_with: tuple[str, ...] = ()
    helps_with: tuple[
        str, ...
    ] = ()  # its gain may show only on top of these: tried with them even if alone it did not help


CANDIDATES: dict[str, Candidate] = {
    c.fix: c
    for c in (
        Candidate(
            "attention", "SDPA / FlashAttention instead of eager attention", True, "same math, fused kernel"
        ),
        Candidate("pretokenize", "tokenize every example once, before training", True, "same batches"),
        Candidate("workers", "DataLoader worker processes, persistent, prefetching", True, "same batches"),
        Candidate(
            "trim_padding",
            "cut the padding columns of each batch",
            True,
            "same examples and labelled tokens",
            exclusive_with=("pack_batch",),
        ),
        Candidate(
            "pack_batch",
            "pack each batch into one padding-free row",
            True,
            "same examples per batch; attention kept per example",
            exclusive_with=("trim_padding",),
        ),
        Candidate(
            "pack",
            "pack whole examples into full rows (best-fit decreasing)",
            False,
            "changes which examples share a row and a batch; attention kept per example",
            exclusive_with=("pretokenize", "trim_padding", "pack_batch", "group_by_length"),
        ),
        Candidate(
            "group_by_length",
            "length-grouped batches",
            False,
            "changes which examples share a batch",
            helps_with=("trim_padding",),  # padded to a fixed length, grouping saves nothing until trimmed
        ),
        Candidate(
            "micro_batch",
            "bigger micro-batch, proportionally less gradient accumulation",
            True,
            "same examples per optimizer step",
        ),
        Candidate("tf32", "TF32 matrix math", True, "same math at TF32 precision", gpu_only=True),
        Candidate("bf16", "bf16 autocast", False, "changes numerics (bf16 matmuls)", gpu_only=True),
        Candidate("no_checkpointing", "activation checkpointing off", True, "same math, no recomputation"),
    )
}

# a finding's cause -> the candidates that address it, most promising first
BY_CAUSE: dict[str, tuple[str, ...]] = {
    "slow_attention": ("attention",),
    "dataloader_bound": ("pretokenize", "workers"),
    "pageable_copies": ("workers",),
    "padding_waste": ("trim_padding", "pack_batch", "pack", "group_by_length"),
    "small_batch": ("micro_batch",),
    "no_mixed_precision": ("bf16", "tf32"),
}


@dataclass
class Proposal:
    candidate: Candidate
    why: str  # the finding (or the user's request) that put it on the list


def propose(
    diagnosis: Diagnosis,
    also: list[str] | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
) -> list[Proposal]:
    """Candidates in the order of the findings that call for them (largest estimated saving first)."""
    env = diagnosis.profile.environment
    on_gpu = env.on_gpu
    hf_model = env.model.model_type is not None
    accumulation = env.grad_accum_steps or 1
    picked: dict[str, Proposal] = {}
    for finding in diagnosis.findings:
        for fix in BY_CAUSE.get(finding.cause, ()):
            candidate = CANDIDATES[fix]
            if fix in picked or (candidate.gpu_only and not on_gpu):
                continue
            if fix == "pretokenize" and env.dataloader.examples_are_text is False:
                continue
            if fix in ("pack_batch", "pack") and not hf_model:
                continue  # the packed batch needs a model that takes position_ids and 4-D masks
            if fix == "micro_batch" and env.framework not in ("hf_trainer", "trl"):
                continue  # a plain loop's accumulation is its own code: nothing to trade from outside
            picked[fix] = Proposal(candidate, f"{finding.cause} ({finding.severity})")
    if env.gradient_checkpointing and "no_checkpointing" not in picked:
        used = diagnosis.metrics.gpu_mem_used_frac
        if not on_gpu or (used is not None and used < 0.5):
            picked["no_checkpointing"] = Proposal(
                CANDIDATES["no_checkpointing"], "checkpointing on with memory to spare"
            )
    if accumulation >= 2 and "micro_batch" not in picked and env.framework in ("hf_trainer", "trl"):
        picked["micro_batch"] = Proposal(
            CANDIDATES["micro_batch"], f"gradient accumulation of {accumulation}"
        )
    for fix in also or []:
        if fix not in picked:
            picked[fix] = Proposal(CANDIDATES[fix], "asked for (--try)")
    chosen = list(picked.values())
    if only:
        chosen = [p for p in chosen if p.candidate.fix in only]
    return [p for p in chosen if p.candidate.fix not in (skip or [])]


def exclusive(a: str, b: str) -> bool:
    """Whether two fixes cannot go together (either one says so)."""
    return b in CANDIDATES[a].exclusive_with or a in CANDIDATES[b].exclusive_with


def unknown_fixes(names: list[str]) -> list[str]:
    return [n for n in names if n not in CANDIDATES]
