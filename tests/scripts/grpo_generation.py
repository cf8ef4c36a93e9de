"""A real TRL GRPOTrainer run on a tiny random Llama, on the CPU: short prompts, long completions, so generating
the rollouts takes most of every step (the ``rl_generation`` cause, planted).

The tokenizer is a word-level one built here with ``tokenizers`` (no download); the reward is the completion's
share of even token ids (trivial, deterministic in the completion). ``--losses PATH`` writes the logged losses
one line a step as they come (loss, grad norm, reward), so a test compares a run under pitstop, which
ends the job after its window, with a plain one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

WORDS = [f"w{i}" for i in range(200)]
SPECIALS = ["<pad>", "<eos>", "<unk>"]


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def model(vocab: int, max_len: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def even_share(completions: list[str], **_: Any) -> list[float]:
    """The share of the completion's words with an even number: a reward that depends on what was sampled."""
    rewards = []
    for text in completions:
        words = text.split()
        rewards.append(sum(1 for w in words if w[1:].isdigit() and int(w[1:]) % 2 == 0) / max(len(words), 1))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--completion", type=int, default=96)  # max_completion_length: long vs 4-word prompts
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--losses", default=None)
    args = parser.parse_args()

    import random

    import torch
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOConfig, GRPOTrainer

    set_seed(0)
    torch.set_num_threads(1)
    tok = tokenizer()
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(64)]
    dataset = Dataset.from_dict({"prompt": prompts})
    policy = model(len(tok), 4 + args.completion + 8)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            num_generations=args.generations,
            max_completion_length=args.completion,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            data_seed=0,
            disable_tqdm=True,
            dataloader_num_workers=0,
            generation_kwargs={"min_new_tokens": args.completion},  # every completion full length
        )
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=even_share,
            args=config,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[loss_lines(args.losses)],
        )
        trainer.train()


def loss_lines(path: str | None) -> Any:
    """A callback that appends each logged step's loss, grad norm and reward to ``path``, one JSON line a step."""
    from transformers import TrainerCallback

    class LossLines(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if path and logs and "loss" in logs:
                with open(path, "a") as f:
                    f.write(json.dumps([logs["loss"], logs.get("grad_norm"), logs.get("reward")]) + "\n")

    return LossLines()


if __name__ == "__main__":
    main()
