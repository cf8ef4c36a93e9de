"""A newcomer's Trainer fine-tune, written the way many first scripts are and not for pitstop: every example
padded to ``max_length`` by the tokenizer, eager attention, ``logging_steps=1``, and no seed set before the
model is built (two plain runs differ in their first losses). The data is fixed; the weights are not.

    python newcomer_trainer.py --steps 200
    python newcomer_trainer.py --crash-at 3      # the job dies at step 3 (a bug in the user's callback)

Nothing here imports pitstop or the other test scripts: it stands for the user's own code."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile

WORDS = 400  # the corpus's vocabulary


def corpus(n: int) -> list[str]:
    """Sentences of 8 to 120 words: most rows are far shorter than max_length."""
    rng = random.Random(1234)  # the data is fixed; the model below is not seeded
    lengths = [rng.randint(8, 120) for _ in range(n)]
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(k)) for k in lengths]


def tokenizer_for(texts: list[str]):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--crash-at", type=int, default=None, help="raise inside training at this step")
    args = parser.parse_args()

    from datasets import Dataset
    from transformers import (
        DataCollatorForLanguageModeling,
        LlamaConfig,
        LlamaForCausalLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    texts = corpus(2000)
    tokenizer = tokenizer_for(texts)

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=args.max_length)

    train = Dataset.from_dict({"text": texts}).map(tokenize, batched=True, remove_columns=["text"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=args.max_length,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="eager")

    class Broken(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == args.crash_at:
                raise RuntimeError(f"the user's callback failed at step {state.global_step}")

    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=3e-4,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
        )
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=train,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            callbacks=[Broken()] if args.crash_at else [],
        )
        trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
