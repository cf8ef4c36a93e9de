"""Fused attention (SDPA / FlashAttention) instead of the eager path that materializes the score matrix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


@register
class Attention(Remedy):
    id = RemedyId.ATTENTION
    title = "SDPA / FlashAttention instead of eager attention"
    tune_rank = 10
    effect = "same math, fused kernel"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``target``: the implementation to load; ``hf_model``: whether the model is a transformers model
        (then the fix is a loading argument whatever the loop); ``alternative``: a second choice to name;
        ``mha``: the model attends with torch's nn.MultiheadAttention (the fix is an argument of its call)."""
        if params.get("mha"):
            return Advice(
                "Call torch's nn.MultiheadAttention with need_weights=False: it then runs the fused kernel "
                "(scaled_dot_product_attention) instead of computing and returning the attention weights.",
                code("""
                    out, _ = self.attn(query, key, value, attn_mask=mask, need_weights=False)
                """),
            )
        target = params.get("target", "sdpa")
        alternative = params.get("alternative")
        text = f"Load the model with a fused attention implementation ('{target}'" + (
            f"; '{alternative}' needs no extra package" if alternative else ""
        )
        text += ") instead of 'eager', which materializes the full attention matrix."
        load = code(f"""
            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="{target}")
            # a model you already have: model.set_attn_implementation("{target}")
        """)
        if framework is Framework.TRL:
            return Advice(
                text, f'config = SFTConfig(..., model_init_kwargs={{"attn_implementation": "{target}"}})'
            )
        if framework is Framework.PYTORCH and params.get("hf_model") is False:
            return Advice(
                text,
                code("""
                    # replace softmax(q @ k.transpose(-2, -1) * scale) @ v with the fused kernel:
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                """),
            )
        return Advice(text, load)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None if facts.hf_model else "switching attention from outside needs a Hugging Face model"

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        target = request.attn_target
        before = getattr(model.config, "_attn_implementation", None)
        if before == target:
            report.skip(self.id, f"the model already runs {target}")
            return
        try:
            model.set_attn_implementation(target)
        except Exception as exc:
            report.skip(self.id, f"{type(model).__name__} cannot switch to {target}: {exc}")
            return
        after = getattr(model.config, "_attn_implementation", None)
        if after == target:
            report.apply(self.id, f"{type(model).__name__}: {before} → {target}", target=target)
        else:
            report.skip(self.id, f"{type(model).__name__} stayed on {after}")
