"""Compute spent on pad tokens: worth the rows (dense mask) or FLOPs (per-example attention) that packing
the batches' examples would save."""

from __future__ import annotations

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise
from pitstop.remedies.trim_padding import pads_per_batch

PADDING_MIN = 0.10


@cause(
    CauseId.PADDING_WASTE,
    title="Compute spent on padding",
    because="variable-length examples are padded; compute is spent on pad tokens",
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when="pad tokens ≥ {PADDING_MIN:.0%} of all tokens",
    estimate=(
        "1/(1 − (forward + backward share) × (1 − what packing keeps)): with a dense mask (SDPA, eager) "
        "the rows the batches' examples fill first-fit at the padded width, over today's rows (counted per "
        "batch); with a per-example attention (FlashAttention, flex) the FLOPs left; else the pad share"
    ),
    remedies=(RemedyId.TRIM_PADDING, RemedyId.PACK_BATCH, RemedyId.PACK, RemedyId.GROUP_BY_LENGTH),
)
def padding_waste(ctx: RuleContext) -> Finding | None:
    m = ctx.metrics
    p = m.padding_frac
    if p is None:
        return _padding_in_config(ctx)
    if p < PADDING_MIN:
        return None
    c, share_basis = _token_share(ctx)
    kept, kept_basis = _packed_work(ctx)
    if kept is None:
        kept, kept_basis = _packed_rows(ctx)
    rows = [s.seq_len for r in ctx.profile.ranks for s in r.steps if s.seq_len]
    fixed_length = bool(rows) and len(set(rows)) == 1 and len(rows) > 2
    source = _padding_source(ctx, rows[0] if fixed_length else None)
    evidence = {
        "padding_frac": round(p, 3),
        "padded_row_len": round(m.seq_len, 1) if m.seq_len else None,
        "mean_example_len": round(m.mean_example_len, 1) if m.mean_example_len else None,
        "tokens_per_s": round(m.tokens_per_s, 1) if m.tokens_per_s else None,
        "real_tokens_per_s": round(m.real_tokens_per_s, 1) if m.real_tokens_per_s else None,
        "fixed_row_length": fixed_length,
        "collate_fn": ctx.env.dataloader.collate_fn,
        **{k: v for k, v in source.items() if k != "code"},
    }
    summary = f"{p:.0%} of the tokens in each batch are padding"
    if fixed_length and m.seq_len:
        summary += f": every row is padded to {int(m.seq_len)} tokens"
        if m.mean_example_len:
            summary += f" while examples average {m.mean_example_len:.0f}"
    if source.get("padded_by") == "tokenizer":
        summary += ', by the job\'s tokenizer call (padding="max_length")' + (
            f" at {source['site']}" if source.get("site") else ""
        )
        summary += (
            f"; the collator ({ctx.env.dataloader.collate_fn}) pads nothing more"
            if source.get("collator_pads_per_batch")
            else ""
        )
    summary += "."
    return Finding(
        cause=CauseId.PADDING_WASTE,
        severity=severity_for(p, 0.30, 0.15),
        confidence=0.9,
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(c * (1 - kept), float("inf")) if kept is not None else amdahl(c * p, float("inf")),
        speedup_basis=(
            f"pad tokens are {p:.1%} of all tokens (measured from attention masks); {share_basis}: "
            + (kept_basis if kept is not None else "1/(1 − share·pad); attention's quadratic part gains more")
        ),
        fix=advise(
            ctx.framework,
            *_padding_uses(
                fixed_length, source, ctx.env.dataloader.collate_fn, rows[0] if fixed_length else None
            ),
        ),
    )


def _padding_source(ctx: RuleContext, width: int | None) -> dict[str, object]:
    """Who pads every row to one width before the collator: a tokenizer call of the job seen padding to
    ``max_length`` (the probe names its line) that the batches' width confirms, or, unseen, rows all one
    width handed to a collator that pads each batch to its longest row (it had nothing left to pad)."""
    loader = ctx.env.dataloader
    per_batch = pads_per_batch(loader.collate_fn)
    pads_to = loader.tokenizer_pads_to
    if pads_to is not None and (width is None or width == pads_to):
        return {
            "padded_by": "tokenizer",
            "padded_to": pads_to,
            "site": loader.tokenizer_padding_site,
            "code": loader.tokenizer_padding_code,
            "collator_pads_per_batch": per_batch,
        }
    if width is not None and per_batch:
        return {"padded_by": "before the collator", "padded_to": width, "collator_pads_per_batch": True}
    return {}


UNPADDED = ("flash_attention_2", "flash_attention_3")  # attend per example already: padding costs dense work
VARLEN = (*UNPADDED, "flex_attention")  # packed rows attend per example


def _packed_work(ctx: RuleContext) -> tuple[float | None, str]:
    """The share of today's forward and backward FLOPs left once the batches are packed, where attention
    packs per example: dense work falls with the tokens (T → R); flex attention over padded rows computes
    each row's L² and packed, each example's own (Σ L·T over rows → Σ L² over examples), so it falls faster
    than the tokens; FlashAttention already unpads a padded batch, so its attention stays and only the dense
    work falls (slower than the tokens). With a dense mask a packed row still attends over its width and the
    share is R / T: None. Only steps that counted all four quantities are used."""
    from pitstop.plan.flops import flops_per_token

    impl = ctx.env.attention.implementation
    steps = [
        s
        for r in ctx.profile.ranks
        for s in r.steps
        if s.tokens and s.real_tokens and s.seq_len and s.attended
    ]
    fpt = flops_per_token(ctx.env.model, 1.0)  # attention FLOPs per token per position of context
    if impl not in VARLEN or not steps or fpt is None or not fpt.attention:
        return None, ""
    tokens = sum(s.tokens or 0 for s in steps)
    real = sum(s.real_tokens or 0 for s in steps)
    padded = sum((s.tokens or 0) * (s.seq_len or 0) for s in steps)  # Σ over rows of L², L the row width
    attended = sum(s.attended or 0 for s in steps)  # Σ over examples of their own L²
    now = attended if impl in UNPADDED else padded
    before = fpt.dense * tokens + fpt.attention * now
    kept = min(1.0, (fpt.dense * real + fpt.attention * attended) / before)
    how = (
        "its attention already skips the padding, the dense work falls with the tokens"
        if impl in UNPADDED
        else "dense work with the tokens, attention from each padded row's L² to each example's own"
    )
    return kept, (
        f"packed per example ({impl}), {kept:.0%} of the forward and backward FLOPs remain ({how}): "
        "1/(1 − share·(1 − kept))"
    )


def _packed_rows(ctx: RuleContext) -> tuple[float | None, str]:
    """Where attention takes a dense mask (SDPA, eager), a packed row still attends over its whole width, so
    packing saves rows, not tokens: the share of today's rows the batches' examples fill when each goes into
    the first row of the padded width it fits (counted by the probe per batch, ``packed_rows``). The last row
    of each batch keeps some padding, so this is less than the tokens' share suggests. None when uncounted."""
    if ctx.env.attention.implementation in VARLEN:
        return None, ""
    steps = [s for r in ctx.profile.ranks for s in r.steps if s.packed_rows and s.samples]
    if not steps:
        return None, ""
    kept = min(1.0, sum(s.packed_rows or 0 for s in steps) / sum(s.samples or 0 for s in steps))
    return kept, (
        f"packed first-fit into rows of the padded width (a dense mask attends over a row's width), the "
        f"batches' examples fill {kept:.0%} of today's rows: 1/(1 − share·(1 − kept))"
    )


def _token_share(ctx: RuleContext) -> tuple[float, str]:
    """The share of the step that scales with the tokens computed on, and what it rests on: the forward and
    backward when the probe timed them (the optimizer step and the data wait do not grow with padding; the
    backward holds any recompute, which does), else the compute share (a trace's kernels, or 1 − data wait)."""
    m = ctx.metrics
    traced = any(t.temporal is not None for t in ctx.traces)
    if not traced and m.forward_frac is not None and m.backward_frac is not None:
        share = min(1.0, m.forward_frac + m.backward_frac)
        return share, (
            f"forward and backward take {share:.0%} of the step (measured) and scale with the tokens; the "
            "optimizer step does not"
        )
    c = ctx.compute_frac
    return c, f"compute takes {c:.0%} of the step and scales with tokens"


def _padding_in_config(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    if env.packing is not False or env.group_by_length or (ctx.measured and not _sampled(ctx)):
        return None
    return Finding(
        cause=CauseId.PADDING_WASTE,
        severity=Severity.MEDIUM,
        confidence=0.5,
        summary=(
            "Packing is off"
            + (f" with rows of up to {env.max_seq_len} tokens" if env.max_seq_len else "")
            + ": variable-length examples will be padded, and the pad tokens computed on."
        ),
        evidence={
            "packing": False,
            "group_by_length": env.group_by_length,
            "max_seq_len": env.max_seq_len,
            "sources": env.config_sources[:3],
        },
        est_speedup=None,
        speedup_basis="config only: `pitstop data stats` or `pitstop doctor` measures the pad share",
        fix=advise(
            ctx.framework, *_padding_uses(False, _padding_source(ctx, None), env.dataloader.collate_fn)
        ),
    )


def _sampled(ctx: RuleContext) -> bool:
    """``pitstop attach``'s sampled view: its steps are from stacks, which hold no tokens, so what the job's
    code shows of padding (``attach/evidence.py``) stands as a config's would."""
    return ctx.profile.source == Source.ATTACH and any(
        (r.step_boundary_reason or "").startswith("sampled: ") for r in ctx.profile.ranks
    )


def _padding_uses(
    fixed_length: bool, source: dict[str, object], collate_fn: str | None, width: int | None = None
) -> list[Use]:
    """Rows all padded to one width: padding per batch first (the simplest change, often one argument in the
    job's own code), then packing into rows of that width. Otherwise packing first (no pad token left), then
    padding per batch."""
    trim = use(
        RemedyId.TRIM_PADDING,
        fixed_length=fixed_length,
        collate_fn=collate_fn,
        **{k: v for k, v in source.items() if k in ("padded_by", "padded_to", "site", "code")},
    )
    padded_to = source.get("padded_to")
    width = width or (padded_to if isinstance(padded_to, int) else None)
    pack = use(RemedyId.PACK, max_len=width) if width else use(RemedyId.PACK)
    if fixed_length or source.get("padded_by") == "tokenizer":
        return [trim, pack, use(RemedyId.GROUP_BY_LENGTH)]
    return [pack, trim, use(RemedyId.GROUP_BY_LENGTH)]
