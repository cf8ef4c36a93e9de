"""Grouped GEMMs for the experts of a mixture-of-experts model instead of a loop over them.

Transformers (>= 5) dispatches the expert modules of its MoE models on ``config._experts_implementation`` at
every forward, so the switch is a loading argument (``experts_implementation="grouped_mm"``, its default) or,
on a model already built, ``model.set_experts_implementation("grouped_mm")``. The computation is the same:
the same experts on the same tokens with the same routing weights, summed in another order (pitstop's test
compares the logits and gradients of both on a tiny Mixtral). The trial switches the first Hugging Face model
before its first forward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

TARGET = "grouped_mm"  # Transformers' grouped experts: two grouped GEMMs over all experts


def _major(version: Any) -> int | None:
    head = str(version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


@register
class GroupedExperts(Remedy):
    id = RemedyId.GROUPED_EXPERTS
    title = "grouped GEMMs for the MoE experts"
    effect = "same experts and routing, summed in another order"
    tunable = True
    tune_rank = 15

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``implementation``: what runs now ("eager", "loop", "grouped_mm"); ``library``: "transformers" when
        Transformers builds the model; ``transformers_version``; ``fallback``: why grouped_mm loops here;
        ``site``: the expert module's class."""
        implementation = params.get("implementation")
        fallback = params.get("fallback")
        major = _major(params.get("transformers_version"))
        hf = params.get("library") == "transformers"
        if fallback:
            return Advice(
                f'experts_implementation="grouped_mm" is asked for, but here it runs a loop over the experts '
                f"({fallback}). Give it its kernel: torch >= 2.9 on an Ampere or newer GPU (torch >= 2.10 for "
                "torch.nn.functional.grouped_mm); on a CPU, torch >= 2.9 with weights not memory-mapped.",
                code("""
                    pip install -U "torch>=2.10"
                    python -c "import torch; print(torch.__version__, torch.cuda.get_device_capability())"
                """),
            )
        if hf and major is not None and major < 5:
            return Advice(
                f"Upgrade Transformers to 5 or later: version {params.get('transformers_version')} loops over "
                "the experts of every MoE model, and 5 runs them as grouped GEMMs (experts_implementation="
                '"grouped_mm", its default).',
                code("""
                    pip install -U "transformers>=5"
                    # then, if your code asked for the loop: from_pretrained(..., experts_implementation="grouped_mm")
                """),
            )
        if implementation == "loop" and params.get("library") == "remote code":
            return Advice(
                "Load the model with Transformers' own class instead of the Hub's remote code: the remote "
                "code loops over an nn.ModuleList of experts, and Transformers (>= 5) runs the same experts "
                'as grouped GEMMs (experts_implementation="grouped_mm", its default).',
                code("""
                    model = AutoModelForCausalLM.from_pretrained(name)  # without trust_remote_code=True
                """),
            )
        if implementation == "loop" and not hf:
            where = f" ({params['site']})" if params.get("site") else ""
            return Advice(
                f"Replace the loop over the nn.ModuleList of experts{where} with grouped GEMMs: stack the experts' "
                "weights into [experts, out, in] tensors and multiply the tokens, sorted by expert, in one "
                "grouped call (torch.nn.functional.grouped_mm, torch >= 2.10); or build the model with "
                "Transformers >= 5, whose MoE models do this, or a fused MoE layer (MegaBlocks, ScatterMoE).",
                code("""
                    order = expert_ids.argsort()                     # tokens grouped by their expert
                    offs = torch.bincount(expert_ids, minlength=E).cumsum(0).to(torch.int32)
                    h = F.grouped_mm(x[order // top_k], w_up.transpose(-2, -1), offs=offs)   # w_up: [E, 2I, d]
                    h = F.grouped_mm(act(h[:, :I]) * h[:, I:], w_down.transpose(-2, -1), offs=offs)
                """),
            )
        text = (
            'Run the experts as grouped GEMMs: load the model with experts_implementation="grouped_mm" '
            "(Transformers' default since v5) instead of "
            + ('"eager"' if implementation == "eager" else "a loop")
            + ", which runs a gather, two small GEMMs and a scatter per expert, forward and backward."
        )
        load = code(f"""
            model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="{TARGET}")
            # a model you already have: model.set_experts_implementation("{TARGET}")
        """)
        if framework is Framework.TRL:
            return Advice(
                text,
                f'config = SFTConfig(..., model_init_kwargs={{"experts_implementation": "{TARGET}"}})\n'
                f'# or a model you pass in: model.set_experts_implementation("{TARGET}")',
            )
        if framework is Framework.LIGHTNING:
            return Advice(
                text,
                code(f"""
                    def configure_model(self):
                        self.model.set_experts_implementation("{TARGET}")
                """),
            )
        return Advice(text, load)

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None if facts.hf_model else "switching the experts implementation needs a Transformers model"

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        config = getattr(model, "config", None)
        before = getattr(config, "_experts_implementation", None)
        switch = getattr(model, "set_experts_implementation", None)
        name = type(model).__name__
        if config is None or not callable(switch):
            report.skip(self.id, f"{name} has no experts implementation to switch (Transformers < 5?)")
            return
        if not any(hasattr(m, "_is_expert_parallel") for m in model.modules()):
            report.skip(
                self.id, f"{name} has no Transformers expert module (the experts loop in its own code)"
            )
            return
        if before == TARGET:
            report.skip(self.id, f"{name} already runs {TARGET}")
            return
        try:
            switch(TARGET)
        except Exception as exc:
            report.skip(self.id, f"{name} cannot switch to {TARGET}: {exc}")
            return
        after = getattr(config, "_experts_implementation", None)
        if after == TARGET:
            report.apply(self.id, f"{name}: experts {before} → {TARGET}")
        else:
            report.skip(self.id, f"{name} stayed on {after}")
