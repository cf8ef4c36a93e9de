"""fp16 mixed precision with loss scaling: the tensor-core path of GPUs without bf16 (V100, T4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, register
from pitstop.remedies.bf16 import mixed_precision_advice
from pitstop.trials.request import FixReport, FixRequest


@register
class Fp16(Remedy):
    id = RemedyId.FP16
    title = "fp16 mixed precision with a loss scaler"
    tune_rank = 100
    effect = "changes numerics (fp16 matmuls, scaled loss)"
    preserves_computation = False
    tunable = True
    exclusive_with = (RemedyId.BF16,)

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        return mixed_precision_advice(
            framework, "fp16", "Train in fp16 mixed precision with loss scaling (this GPU has no fast bf16)."
        )

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.on_gpu:
            return "fp16 autocast pays off on GPU tensor cores"
        if facts.gpu_has_bf16 is not False:
            return "bf16 is the better choice where the GPU has it (no loss scaling)"
        if not facts.framework.is_trainer:
            return "fp16 needs a loss scaler inside the job's own loop: tune only sets it through the Trainer"
        return None

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        args.fp16, args.bf16 = True, False
        report.apply(self.id, "TrainingArguments(fp16=True): autocast and the Trainer's GradScaler")
