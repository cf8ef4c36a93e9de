"""Offload off where the model states fit on the GPUs (or made to fit another way before paying PCIe)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register

_DS_OFF = code("""
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "none"}
    }
""")


@register
class NoOffload(Remedy):
    id = RemedyId.NO_OFFLOAD
    title = "offload off"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``offloaded``: {"optimizer": device, "param": device}; ``fits_without``: the planner's answer;
        ``gpus``: GPUs in the job."""
        offloaded: dict[str, str] = dict(params.get("offloaded") or {})
        what = " and ".join(f"{k} states to {v}" for k, v in sorted(offloaded.items())) or "model states"
        if params.get("fits_without"):
            text = f"The run offloads {what}, but it fits in GPU memory without offload: turn offload off."
        else:
            gpus = max(int(params.get("gpus") or 1), 2)
            text = (
                f"The run offloads {what}. Before paying PCIe on every step, make it fit on the GPUs: shard with "
                f"ZeRO-3 across {gpus} GPUs, train LoRA adapters, or use an 8-bit optimizer."
            )
        if framework is Framework.DEEPSPEED:
            return Advice(text, _DS_OFF)
        if framework.is_trainer:
            snippet = f"# in the ds_config.json passed as {framework.args_class}(deepspeed=...):\n" + _DS_OFF
            if not params.get("fits_without"):
                snippet += (
                    '\n# or: LoRA (peft.LoraConfig(r=16)), or TrainingArguments(optim="adamw_bnb_8bit")'
                )
            return Advice(text, snippet)
        if framework is Framework.ACCELERATE:
            return Advice(
                text, "# accelerate config: offload_optimizer_device: none, offload_param_device: none"
            )
        return Advice(
            text, "# FSDP: FullyShardedDataParallel(model, cpu_offload=CPUOffload(offload_params=False))"
        )
