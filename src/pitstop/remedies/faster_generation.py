"""Faster rollouts for an online RL trainer: generate with vLLM (colocated in the training process, or a server on
GPUs of its own), or with transformers' continuous batching, and size what is generated (completions per prompt,
their maximum length, how many are generated at once).

Not something tune tries: vLLM runs on a GPU only, and every one of these changes what the trainer samples (another
engine's sampling, fewer or shorter completions), so a trial's losses could not be compared with the job's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register

# a trainer's config class by the trainer's name (TRL names them in pairs); the GRPO one where not known
CONFIGS = {"RLOOTrainer": "RLOOConfig", "OnlineDPOTrainer": "OnlineDPOConfig"}


def config_class(trainer: Any) -> str:
    name = str(trainer) if trainer else "GRPOTrainer"
    return CONFIGS.get(name, name.replace("Trainer", "Config") if name.endswith("Trainer") else "GRPOConfig")


@register
class FasterGeneration(Remedy):
    id = RemedyId.FASTER_GENERATION
    title = "faster rollouts (vLLM, fewer or shorter completions)"
    effect = "another engine samples the completions, or fewer / shorter ones: what is trained on changes"
    preserves_computation = False

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``trainer``: the trainer's class; ``use_vllm`` / ``vllm_mode``: what generates now;
        ``num_generations``, ``max_completion_length``, ``generation_batch_size``: the rollout sizes in use."""
        use_vllm, mode = params.get("use_vllm"), params.get("vllm_mode")
        n, length = params.get("num_generations"), params.get("max_completion_length")
        batch = params.get("generation_batch_size")
        if use_vllm:
            engine = (
                f"vLLM already generates ({mode or 'colocate'} mode): give it more of the GPU "
                "(vllm_gpu_memory_utilization) or GPUs of its own (server mode, `trl vllm-serve`), and generate "
                "more completions per call (a larger generation_batch_size) so each decoding step batches more"
            )
        else:
            engine = (
                "Generate the rollouts with vLLM instead of the model's own generate(): use_vllm=True with "
                'vllm_mode="colocate" shares the training GPUs (vllm_gpu_memory_utilization sets its share of '
                'their memory), vllm_mode="server" sends the requests to `trl vllm-serve` on GPUs of its own; '
                "without vLLM, use_transformers_continuous_batching=True batches the decoding in-process"
            )
        sizes = []
        if n:
            sizes.append(f"num_generations={n}")
        if length:
            sizes.append(f"max_completion_length={length}")
        if batch:
            sizes.append(f"generation_batch_size={batch}")
        now = f" (now {', '.join(sizes)})" if sizes else ""
        text = (
            f"{engine}. Generation time grows with the completions sampled per prompt and their length{now}: "
            "fewer generations or a shorter max_completion_length cut it directly, at a cost to the advantage "
            "estimate and to long answers; both change what is trained on."
        )
        return Advice(text, self._snippet(framework, params))

    def _snippet(self, framework: Framework, params: Mapping[str, Any]) -> str:
        if framework is Framework.TRL:
            config = config_class(params.get("trainer"))
            return code(f"""
                # pip install "trl[vllm]"  (a GPU; TRL pins the vLLM versions it supports)
                config = {config}(
                    ...,
                    use_vllm=True,
                    vllm_mode="colocate",              # vLLM in the training process, on the same GPUs
                    vllm_gpu_memory_utilization=0.3,   # its share of each GPU's memory (weights + KV cache)
                    # generation_batch_size=...,       # more completions per call: better batched decoding
                    # num_generations=..., max_completion_length=...,  # fewer / shorter: less to generate
                )
                # or GPUs of vLLM's own: `CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model <model>` and
                # {config}(..., use_vllm=True, vllm_mode="server")
                # without vLLM: {config}(..., use_transformers_continuous_batching=True)
            """)
        return code("""
            # generate the rollouts with vLLM (a GPU), batched: every prompt's completions in one call
            from vllm import LLM, SamplingParams
            llm = LLM(model=model_path, gpu_memory_utilization=0.3)
            outputs = llm.generate(prompts, SamplingParams(n=num_generations, max_tokens=max_new_tokens))
            # after each optimizer step, load the policy's new weights into llm before the next rollouts
            # with transformers' generate(): one call for all prompts, and the smallest max_new_tokens that works
        """)

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return (
            "vLLM generates on a GPU only and needs the vLLM package; and every form of this fix (another "
            "engine's sampling, fewer or shorter completions) changes what the trainer samples, so a trial's "
            "losses could not be compared with the job's: switch it in the job's config"
        )
