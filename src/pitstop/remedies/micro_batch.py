"""A bigger micro-batch with proportionally less gradient accumulation: the same examples per optimizer
step in fewer, fuller forward passes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


def largest_factor(accumulation: int, limit: int) -> int:
    """The largest k <= limit that divides the accumulation (so micro × k × accumulation / k is unchanged)."""
    return max((k for k in range(1, min(accumulation, limit) + 1) if accumulation % k == 0), default=1)


def next_micro_batch(micro: int, accumulation: int, planned: int | None) -> tuple[int, int] | None:
    """The micro-batch to move to and the accumulation that keeps the effective batch: the largest size
    up to the planner's limit that divides the effective batch; None when nothing larger keeps it whole."""
    effective = micro * accumulation
    limit = planned if planned else micro * 2
    sizes = [b for b in range(micro + 1, limit + 1) if effective % b == 0]
    if not sizes:
        return None
    new = max(sizes)
    return new, effective // new


def _model_small(params: Mapping[str, Any]) -> Advice:
    """The advice for a model too small for its GPU: not a larger batch, but less of what the step pays
    besides the GPU's work."""
    micro, copy_ms, host_ms = params.get("micro"), params.get("copy_ms"), params.get("host_ms")
    text = (
        f"Do not raise the batch further{f' than {micro:,}' if micro else ''}: the model is too small for this GPU, and "
        "a larger batch grows the copy with the work. Cut what each step pays besides the GPU's work: the "
        "host-to-device copy"
        + (f" ({copy_ms:.2f} ms per step)" if copy_ms else "")
        + " — keep a dataset that fits in GPU memory on the GPU and index batches there, else pin the "
        "loader's memory and copy with non_blocking=True — and the host's time"
        + (f" ({host_ms:.2f} ms)" if host_ms else "")
        + ". The GPU's spare capacity can take a larger model, or several runs at once."
    )
    snippet = code("""
        # the copy each step pays: pinned host memory, copied without blocking (or keep the data on the GPU)
        loader = DataLoader(train, ..., batch_size=B, pin_memory=True)
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    """)
    return Advice(text, snippet)


def _inference(params: Mapping[str, Any]) -> Advice:
    """The advice for an inference / evaluation trace: more examples per forward pass; there is no
    optimizer step, so no accumulation to trade."""
    micro, new_micro = params.get("micro"), params.get("new_micro")
    text = (
        f"Feed more examples per forward pass{f': from {micro:,} to {new_micro:,}' if micro and new_micro else ''} "
        "(this trace is inference or evaluation: no backward, no optimizer step), as far as memory allows."
    )
    batch_size = new_micro or "B"
    snippet = f"loader = DataLoader(dataset, ..., batch_size={batch_size})   # under torch.inference_mode()"
    return Advice(text, snippet)


@register
class MicroBatch(Remedy):
    id = RemedyId.MICRO_BATCH
    title = "bigger micro-batch, proportionally less gradient accumulation"
    tune_rank = 80
    effect = "same examples per optimizer step"
    tunable = True
    changes_batch_shape = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``micro``/``accum``: today's, when known; ``new_micro``/``new_accum``: the sizes to move to, with
        ``basis`` saying where they come from (the planner, a trial); ``planned``: the planner's largest;
        ``model_small``: the batch is already large and the model too small for the GPU (``copy_ms``,
        ``host_ms``: what each step pays besides the GPU's work), so the advice is not a larger batch;
        ``inference``: the trace is inference or evaluation (more examples per forward, no accumulation)."""
        if params.get("model_small"):
            return _model_small(params)
        if params.get("inference"):
            return _inference(params)
        micro, accum = params.get("micro"), params.get("accum")
        new_micro, new_accum = params.get("new_micro"), params.get("new_accum")
        basis = params.get("basis")
        if new_micro and micro:
            text = f"Raise the micro-batch from {micro} to {new_micro}"
            if accum is not None and new_accum is not None:
                text += f" and lower gradient accumulation from {accum} to {new_accum}, so the effective batch stays the same"
            text += f" ({basis})." if basis else "."
        else:
            text = (
                "Raise the micro-batch and lower gradient accumulation by the same factor, as far as memory "
                "allows; the micro-batch of this run is unknown here: `pitstop plan --model config.json --gpu "
                "NAME` predicts the largest that fits"
            )
            text += f" ({basis})." if basis else "."
        mb = new_micro or "B"  # B: the size to try, named in the text
        acc = new_accum if new_micro else "A"  # None: accumulation unknown (a plain loop read from a trace)
        pytorch = f"loader = DataLoader(train, ..., batch_size={mb})" + (
            f"   # and accumulate {acc} micro-batches" if acc is not None else ""
        )
        acc = 1 if acc is None else acc
        snippets = {
            Framework.HF_TRAINER: f"args = TrainingArguments(..., per_device_train_batch_size={mb},\n"
            f"                         gradient_accumulation_steps={acc})\n# or let the Trainer search: auto_find_batch_size=True",
            Framework.TRL: f"config = SFTConfig(..., per_device_train_batch_size={mb}, gradient_accumulation_steps={acc})",
            Framework.LIGHTNING: f"trainer = L.Trainer(..., accumulate_grad_batches={acc})  # DataLoader(batch_size={mb})",
            Framework.DEEPSPEED: f'"train_micro_batch_size_per_gpu": {mb}, "gradient_accumulation_steps": {acc}',
        }
        return Advice(text, snippets.get(framework, pytorch))

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.framework.is_trainer:
            return "a plain loop's accumulation is its own code: nothing to trade from outside"
        return None

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        accumulation = int(args.gradient_accumulation_steps)
        k = largest_factor(accumulation, request.micro_batch_factor)
        if k <= 1:
            report.skip(self.id, "no gradient accumulation to trade for a bigger micro-batch")
            return
        mb = int(args.per_device_train_batch_size)
        args.per_device_train_batch_size = mb * k
        args.gradient_accumulation_steps = accumulation // k
        report.apply(
            self.id,
            f"per_device_train_batch_size {mb} → {mb * k}, gradient_accumulation_steps {accumulation} → {accumulation // k}",
            micro=mb,
            accum=accumulation,
            new_micro=mb * k,
            new_accum=accumulation // k,
            basis="measured by pitstop tune",
        )
