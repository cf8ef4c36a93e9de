"""Pin the library versions the faster run used, look for the default the new version changed, report it
upstream.

A pin is the quick way to get the speed back and to prove the upgrade was the cause (the speed returns with
the old versions); the lasting fix is the changed default set back explicitly on the new version, and a report
to the project whose release slowed the job. Tune cannot try it: a package version is chosen before the job
starts, not inside it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register

_MINOR = re.compile(r"^(\d+)\.(\d+)")

# the defaults and kernels a release of each package is known to change, where to look first
CHANGED_DEFAULTS = {
    "transformers": (
        "the attention implementation a model loads with (attn_implementation), the MoE experts "
        "implementation (experts_implementation: grouped_mm from 5.0 unless told eager), gradient checkpointing's "
        "use_reentrant"
    ),
    "torch": "activation checkpointing's use_reentrant, the SDPA backend chosen, torch.compile's graph breaks",
    "deepspeed": "ZeRO's bucket sizes and overlap_comm, the optimizer it builds (fused or not)",
    "bitsandbytes": "the 4-bit compute dtype (bnb_4bit_compute_dtype) and the dequantization kernels",
    "accelerate": "the mixed precision and gradient-accumulation handling it applies",
    "peft": "how adapters are applied (target_modules, use_dora) and whether they are merged",
    "trl": "the trainer config's defaults: packing, padding_free, max_length, use_liger_kernel",
    "flash_attn": "the kernels it picks for the job's shapes and dtype",
    "xformers": "the attention kernels it dispatches to",
    "liger_kernel": "which layers it patches",
    "lightning": "the precision plugin and the strategy's defaults",
    "pytorch_lightning": "the precision plugin and the strategy's defaults",
}
# where each package takes bug reports
UPSTREAM = {
    "transformers": "github.com/huggingface/transformers/issues",
    "torch": "github.com/pytorch/pytorch/issues",
    "deepspeed": "github.com/deepspeedai/DeepSpeed/issues",
    "bitsandbytes": "github.com/bitsandbytes-foundation/bitsandbytes/issues",
    "accelerate": "github.com/huggingface/accelerate/issues",
    "peft": "github.com/huggingface/peft/issues",
    "trl": "github.com/huggingface/trl/issues",
    "flash_attn": "github.com/Dao-AILab/flash-attention/issues",
    "xformers": "github.com/facebookresearch/xformers/issues",
    "liger_kernel": "github.com/linkedin/Liger-Kernel/issues",
    "lightning": "github.com/Lightning-AI/pytorch-lightning/issues",
    "pytorch_lightning": "github.com/Lightning-AI/pytorch-lightning/issues",
}
# the name pip installs a package by, where it is not the module's
DISTRIBUTION = {
    "flash_attn": "flash-attn",
    "liger_kernel": "liger-kernel",
    "pytorch_lightning": "pytorch-lightning",
}
# where a phase's time goes, to say which defaults to look at first
PHASE_HINT = {
    "data wait": "the DataLoader, tokenizer and collator",
    "forward": "the model's kernels (attention, experts, quantized linears)",
    "backward": "the model's kernels and activation checkpointing",
    "optimizer": "the optimizer's implementation (fused, foreach) and ZeRO's communication",
    "other": "logging, evaluation and checkpoint saving between steps",
    "generation": "the generation backend and its batch size",
}


def minor_version(version: str) -> str:
    """``"2.5.1+cu124"`` → ``"2.5"``; a version without a dotted number is kept whole."""
    match = _MINOR.match(version.strip())
    return f"{match[1]}.{match[2]}" if match else version.strip()


def pin(package: str, version: str) -> str:
    """The pip requirement that brings back ``version``'s minor release: ``transformers==4.57.*``."""
    name = DISTRIBUTION.get(package, package)
    if _MINOR.match(version.strip()):
        return f"{name}=={minor_version(version)}.*"
    return f"{name}=={version.strip().split('+', 1)[0]}"  # no dotted number: that exact version


def _changes(params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    raw = params.get("changed")
    out: list[tuple[str, str, str]] = []
    for item in raw if isinstance(raw, Sequence) and not isinstance(raw, str) else []:
        if isinstance(item, Mapping) and item.get("package") and item.get("old") and item.get("new"):
            out.append((str(item["package"]), str(item["old"]), str(item["new"])))
    return out


@register
class PinVersions(Remedy):
    id = RemedyId.PIN_VERSIONS
    title = "pin the library versions of the faster run"
    effect = "the versions the faster run used; the new versions' other changes given up until fixed upstream"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``changed``: [{package, old, new}] of the packages whose versions differ from the faster run's;
        ``phase``: the phase of the step that grew most; ``baseline_run``: the faster run's history id."""
        changes = _changes(params)
        run = params.get("baseline_run")
        faster = f"run #{run}" if run is not None else "the faster run"
        if changes:
            back = ", ".join(f"{p} {new} → {old}" for p, old, new in changes)
            pins = " ".join(f'"{pin(p, old)}"' for p, old, _ in changes)
            first = f"Pin the versions {faster} used ({back}: pip install {pins}) and rerun: the speed coming back "
        else:
            first = (
                f"Pin the library versions {faster} used (`pitstop history show ID` lists them) and rerun: the "
                "speed coming back "
            )
        text = first + "confirms the upgrade as the cause."
        phase = params.get("phase")
        looks = [f"{p}: {CHANGED_DEFAULTS[p]}" for p, _, _ in changes if p in CHANGED_DEFAULTS]
        where = (
            f" The step's {phase} grew most: look at {PHASE_HINT.get(str(phase), 'what runs there')}."
            if phase
            else ""
        )
        if looks:
            text += (
                f"{where} Then set back explicitly the default the new version changed ({'; '.join(looks)})."
            )
        else:
            text += (
                f"{where} Then set back explicitly the default the new version changed (the release notes between "
                "the two versions name them)."
            )
        places = sorted({UPSTREAM[p] for p, _, _ in changes if p in UPSTREAM})
        upstream = f" ({', '.join(places)})" if places else ""
        text += (
            f" Report the slowdown upstream{upstream} with both versions and `pitstop history compare` of the two "
            "runs."
        )
        return Advice(text, self._snippet(framework, changes))

    def _snippet(self, framework: Framework, changes: list[tuple[str, str, str]]) -> str:
        if changes:
            pins = " ".join(f'"{pin(p, old)}"' for p, old, _ in changes)
            lines = [f"pip install {pins}  # the versions of the faster run; keep them in requirements.txt"]
        else:
            lines = ['pip install "PACKAGE==X.Y.*"  # each package at the version of the faster run']
        names = {p for p, _, _ in changes}
        lines += self._explicit(framework, names)
        return "\n".join(lines)

    @staticmethod
    def _explicit(framework: Framework, names: set[str]) -> list[str]:
        """The changed defaults set explicitly on the new version, in the framework's own words."""
        every = not names  # nothing named: show the usual suspects
        lines: list[str] = ["# or keep the new versions and set back what changed, e.g.:"]
        if every or "transformers" in names:
            lines.append(
                'model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="sdpa")  # as the faster run loaded'
            )
            lines.append(
                'model.set_experts_implementation("grouped_mm")  # MoE: as the faster run ran ("eager" loops)'
            )
        if framework.is_trainer and (every or names & {"transformers", "torch", "trl"}):
            lines.append(
                f'args = {framework.args_class}(..., gradient_checkpointing_kwargs={{"use_reentrant": False}})'
            )
        elif framework is Framework.LIGHTNING and (
            every or names & {"lightning", "pytorch_lightning", "torch"}
        ):
            lines.append(
                'trainer = L.Trainer(..., precision="bf16-mixed")  # the precision the faster run used'
            )
        elif framework is Framework.ACCELERATE and (every or names & {"accelerate", "torch"}):
            lines.append('accelerator = Accelerator(mixed_precision="bf16")  # as the faster run resolved it')
        elif framework is Framework.DEEPSPEED or "deepspeed" in names:
            lines.append(
                '# ds_config.json: "zero_optimization": {"overlap_comm": true, "reduce_bucket_size": ...}'
            )
        elif every or "torch" in names:
            lines.append("torch.utils.checkpoint.checkpoint(block, *inputs, use_reentrant=False)")
        return lines

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.PYTORCH,
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.ACCELERATE,
            Framework.LIGHTNING,
            Framework.DEEPSPEED,
        )
