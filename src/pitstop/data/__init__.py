"""Input-pipeline fixes: tokenize once into a cache, pack without cross-contamination, group by length.

from pitstop.data import build_cache, PackedDataset, PackingCollator
cache = build_cache("train.jsonl", tokenizer="tok.json", out="cache/", template="alpaca")
trainer = Trainer(model, args, train_dataset=PackedDataset(cache, max_len=4096),
                  data_collator=PackingCollator(model.config._attn_implementation))
"""

from __future__ import annotations

from typing import Any

from pitstop.data.packing import PackingPlan, plan_packing

__all__ = [
    "CachedExamples",
    "LengthGroupedBatchSampler",
    "PackedDataset",
    "PackingCollator",
    "PackingPlan",
    "build_cache",
    "open_cache",
    "plan_packing",
]

_LAZY = {
    "build_cache": "pitstop.data.cache",
    "open_cache": "pitstop.data.cache",
    "PackedDataset": "pitstop.data.dataset",
    "CachedExamples": "pitstop.data.dataset",
    "PackingCollator": "pitstop.data.collate",
    "LengthGroupedBatchSampler": "pitstop.data.sampler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pitstop.data' has no attribute {name!r}")
