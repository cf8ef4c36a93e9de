"""Supervised fine-tuning of a tiny Llama on Alpaca with TRL's ``SFTTrainer``.

Follows the TRL quick-start pattern for conversational data: convert each
Alpaca record into a ``messages`` list (user turn = instruction + optional
input, assistant turn = output), give the tokenizer a ChatML chat template,
and hand a randomly initialised 2-layer ``LlamaConfig`` model object plus the
tokenizer (as ``processing_class``) to ``SFTTrainer`` configured by
``SFTConfig``. The tokenizer is the stock GPT-2 BPE vocabulary loaded from a
local file, shrunk by training a smaller BPE on the data with the same
pre-tokenizer so that CPU steps stay cheap. Runs on CPU, no checkpoints, all
outputs in a temporary directory.
"""

import argparse
import json
import tempfile

from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

DATA_PATH = "/work/shared/data/datasets/alpaca_en_demo.json"
TOKENIZER_PATH = "/work/shared/data/tokenizers/gpt2_tokenizer.json"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def to_messages(example):
    prompt = example["instruction"]
    if example["input"]:
        prompt += "\n\n" + example["input"]
    return {
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": example["output"]}]
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    set_seed(0)

    with open(DATA_PATH) as f:
        records = json.load(f)
    dataset = Dataset.from_list(records).map(to_messages, remove_columns=["instruction", "input", "output"])

    # Start from the GPT-2 tokenizer and retrain it on our data with a small vocabulary.
    base_tokenizer = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER_PATH)
    corpus = (r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in records)
    tokenizer = base_tokenizer.train_new_from_iterator(
        corpus, vocab_size=4096, new_special_tokens=["<|im_start|>", "<|im_end|>", "<pad>"]
    )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<pad>"
    tokenizer.chat_template = CHATML_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.max_length,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    print(f"model parameters: {model.num_parameters() / 1e6:.2f}M, vocab {len(tokenizer)}")

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = SFTConfig(
            output_dir=output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=3e-4,
            lr_scheduler_type="linear",
            warmup_steps=5,
            max_length=args.max_length,
            packing=False,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=0,
        )
        trainer = SFTTrainer(
            model=model,
            args=training_args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train()
        print("final log:", trainer.state.log_history[-1])


if __name__ == "__main__":
    main()
