"""Fine-tune a tiny Llama on Alpaca instructions with the Hugging Face ``Trainer``.

A typical "causal LM fine-tuning with Trainer" tutorial: load the Alpaca JSON
with ``datasets.load_dataset`` (cache in a temporary directory), render each
record with the standard Alpaca prompt template, train a small byte-level BPE
tokenizer on the data with the ``tokenizers`` library, tokenize with
``Dataset.map(batched=True)``, and train a randomly initialised 2-layer Llama
(``LlamaConfig``) using ``TrainingArguments`` + ``Trainer`` with
``DataCollatorForLanguageModeling(mlm=False)``. Runs on CPU, logs every 10
steps, saves no checkpoints and keeps all outputs in a temporary directory.
"""

import argparse
import tempfile

from datasets import load_dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DataCollatorForLanguageModeling,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    set_seed,
)

DATA_PATH = "/work/shared/data/datasets/alpaca_en_demo.json"

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n{output}"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n{output}"
)


def format_example(example):
    template = PROMPT_WITH_INPUT if example["input"] else PROMPT_NO_INPUT
    return {"text": template.format(**example)}


def build_tokenizer(texts, vocab_size=4096):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    set_seed(42)

    with tempfile.TemporaryDirectory() as tmp_dir:
        dataset = load_dataset("json", data_files=DATA_PATH, split="train", cache_dir=f"{tmp_dir}/hf_cache")
        dataset = dataset.map(format_example, remove_columns=dataset.column_names)

        tokenizer = build_tokenizer(dataset["text"])

        def tokenize(batch):
            texts = [t + tokenizer.eos_token for t in batch["text"]]
            return tokenizer(texts, truncation=True, max_length=args.max_length)

        tokenized = dataset.map(tokenize, batched=True, remove_columns=["text"])
        data_collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)

        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=args.max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = LlamaForCausalLM(config)
        print(f"model parameters: {model.num_parameters() / 1e6:.2f}M")

        training_args = TrainingArguments(
            output_dir=f"{tmp_dir}/out",
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=5e-4,
            weight_decay=0.01,
            lr_scheduler_type="cosine",
            warmup_steps=10,
            max_grad_norm=1.0,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            dataloader_num_workers=0,
            seed=42,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=tokenized,
            data_collator=data_collator,
            processing_class=tokenizer,
        )
        result = trainer.train()
        print(f"final train loss: {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
