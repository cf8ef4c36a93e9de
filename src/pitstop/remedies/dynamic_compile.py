"""Let torch.compile trace shapes symbolically, so a new sequence length reuses the compiled graph instead of
compiling another (and, past the recompile limit, running eagerly).

``dynamic=False`` specializes every compile to the exact shapes it saw: batches padded to their longest
example bring a new length, and a new compile, nearly every step, until the frame reaches the recompile limit
and runs uncompiled from then on. ``dynamic=True`` (or torch's default ``None``, which makes a dimension
dynamic once it has changed) compiles one graph for every length. The computation is the same up to
floating-point order, so per-step losses agree.

The trial wraps ``torch.compile`` in the trial process (``nn.Module.compile`` and Accelerate's dynamo plugin
call it too): a call that passes ``dynamic=False``, or leaves it to torch while automatic dynamic shapes are
off, gets ``dynamic=True``; any other call is handed on unchanged and the fix is reported as not applicable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


def needs_dynamic(dynamic: Any, automatic: bool) -> bool:
    """Whether a torch.compile call with this ``dynamic=`` specializes every shape (the fix changes it)."""
    return dynamic is False or (dynamic is None and not automatic)


@register
class DynamicCompile(Remedy):
    id = RemedyId.DYNAMIC_COMPILE
    title = "torch.compile with dynamic shapes"
    tune_rank = 75
    effect = "same math; one compiled graph for every sequence length (fp order may differ)"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``dynamic``: what the job passed to torch.compile (False, None: left to torch, True); ``site``:
        the job's line that called it."""
        dynamic = params.get("dynamic")
        site = params.get("site")
        where = f" at {site}" if site else ""
        if dynamic is False:
            text = (
                f"Drop dynamic=False from torch.compile{where} (or pass dynamic=True): it compiles a new graph "
                "for every sequence length the batches bring."
            )
        else:
            text = (
                f"Compile with dynamic shapes{where} (dynamic=True, or mark the sequence dimension dynamic), "
                "so a new length reuses the compiled graph."
            )
        if framework.is_trainer:
            return Advice(
                text
                + " The Trainer compiles through Accelerate: keep torch_compile=True and let its dynamo plugin "
                "use dynamic shapes.",
                code(f"""
                    args = {framework.args_class}(..., torch_compile=True)
                    # and in the job's environment (or `dynamo_use_dynamic: true` in the accelerate config):
                    # ACCELERATE_DYNAMO_USE_DYNAMIC=true
                """),
            )
        if framework is Framework.ACCELERATE:
            return Advice(
                text,
                code("""
                    from accelerate.utils import TorchDynamoPlugin
                    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", dynamic=True))
                """),
            )
        if framework is Framework.LIGHTNING:
            return Advice(text, "model = torch.compile(model, dynamic=True)  # before trainer.fit(model)")
        return Advice(
            text,
            code("""
                model = torch.compile(model, dynamic=True)   # or leave dynamic unset: torch's automatic dynamic shapes
                # or keep the rest static and mark only the sequence dimension, before each forward:
                torch._dynamo.mark_dynamic(batch["input_ids"], 1)
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.ACCELERATE,
            Framework.LIGHTNING,
            Framework.PYTORCH,
        )

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Any]:
        return {"torch": self._patch_compile}

    def _patch_compile(self, torch: ModuleType, request: FixRequest, report: FixReport) -> None:
        original = torch.compile

        def compile(*args: Any, **kwargs: Any) -> Any:  # torch's own name: the wrapper reads as it
            import torch._dynamo  # what torch.compile imports first thing

            dynamic = kwargs.get("dynamic")
            automatic = bool(getattr(torch._dynamo.config, "automatic_dynamic_shapes", True))
            if needs_dynamic(dynamic, automatic):
                kwargs["dynamic"] = True
                was = (
                    "dynamic=False" if dynamic is False else "dynamic unset with automatic dynamic shapes off"
                )
                report.apply(self.id, f"torch.compile(..., dynamic=True) in place of {was}", dynamic=dynamic)
            else:
                report.skip(
                    self.id, f"the job's torch.compile already traces shapes dynamically (dynamic={dynamic})"
                )
            return original(*args, **kwargs)

        compile.__wrapped__ = original  # type: ignore[attr-defined]
        torch.compile = compile  # type: ignore[attr-defined]
