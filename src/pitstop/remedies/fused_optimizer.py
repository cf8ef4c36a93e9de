"""A fused optimizer step: one kernel per parameter group instead of one (or a few) per parameter."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, register
from pitstop.trials.request import FixReport, FixRequest

FUSABLE = (
    "Adam",
    "AdamW",
    "SGD",
    "Adagrad",
)  # torch.optim classes with fused=True (CUDA; Adam(W)/SGD/Adagrad on CPU too)


def _devices(params: list[Any]) -> set[str]:
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    return {t.device.type for t in tensors if hasattr(t, "device")}


@register
class FusedOptimizer(Remedy):
    id = RemedyId.FUSED_OPTIMIZER
    title = "fused optimizer"
    tune_rank = 150
    effect = "same update, one kernel per group"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``optimizer``: the job's optimizer class name."""
        name = params.get("optimizer") or "AdamW"
        text = f"Use the fused {name} step (fused=True): the same update in a few large kernels instead of one per parameter."
        if framework.is_trainer:
            return Advice(text, f'args = {framework.args_class}(..., optim="adamw_torch_fused")')
        if framework is Framework.LIGHTNING:
            return Advice(
                text, f"# configure_optimizers(): torch.optim.{name}(self.parameters(), lr=..., fused=True)"
            )
        return Advice(text, f"opt = torch.optim.{name}(model.parameters(), lr=..., fused=True)")

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Any]:
        return {"torch.optim": self._patch_optimizers}

    def _patch_optimizers(self, optim: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Constructors that leave fused and foreach unset get fused=True (foreach=True where the parameters
        are on a device without a fused kernel)."""
        for name in FUSABLE:
            cls = getattr(optim, name, None)
            if cls is None:
                continue
            original = cls.__init__

            def __init__(
                opt: Any, params: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any
            ) -> None:
                if kwargs.get("fused") is not None or kwargs.get("foreach") is not None or args:
                    return _original(opt, params, *args, **kwargs)  # the job chose (positional: leave it)
                params = list(params)
                devices = _devices(params)
                if devices and devices <= {"cuda", "cpu"} and len(devices) == 1:
                    _original(opt, params, fused=True, **kwargs)
                    report.apply(self.id, f"{_name}(fused=True)", optimizer=_name)
                else:
                    _original(opt, params, foreach=True, **kwargs)
                    report.apply(
                        self.id, f"{_name}(foreach=True) (parameters on {sorted(devices)})", optimizer=_name
                    )

            __init__.__wrapped__ = original  # type: ignore[attr-defined]
            cls.__init__ = __init__
