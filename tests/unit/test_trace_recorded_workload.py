"""Issue 43, item 6 on traces recorded here: torch.profiler around a real tiny Llama (transformers, random
weights) evaluated under ``inference_mode`` reads as inference, and the same model trained for a few steps
reads as training, with the steps its ProfilerStep spans give. CPU traces: the workload comes from the host's
operators (a backward pass, an optimizer step), which a CPU trace records as a GPU one does."""

from __future__ import annotations

from pathlib import Path

import pytest

from pitstop.core.vocabulary import Workload
from pitstop.trace import load_trace

pytestmark = pytest.mark.slow  # torch and transformers in-process, a few seconds of profiling


def _model():  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    return LlamaForCausalLM(config)


def _record(tmp_path: Path, train: bool) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = _model()
    ids = torch.randint(0, 256, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if train else None
    out = tmp_path / ("train.json" if train else "eval.json")
    when = schedule(wait=0, warmup=1, active=3, repeat=1)
    export = lambda p: p.export_chrome_trace(str(out))  # noqa: E731 (as the profiler's docs write it)
    with profile(activities=[ProfilerActivity.CPU], schedule=when, on_trace_ready=export) as prof:
        for _ in range(4):
            if train:
                assert opt is not None
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            else:
                with torch.inference_mode():
                    model(input_ids=ids)
            prof.step()
    return out


def test_an_evaluation_loop_recorded_by_torch_profiler_reads_as_inference(tmp_path: Path) -> None:
    rank = load_trace(_record(tmp_path, train=False))
    assert rank.trace is not None and rank.trace.workload == Workload.INFERENCE
    assert len(rank.steps) == 3  # the three active ProfilerStep spans


def test_the_same_model_trained_reads_as_training(tmp_path: Path) -> None:
    rank = load_trace(_record(tmp_path, train=True))
    assert rank.trace is not None and rank.trace.workload == Workload.TRAINING
    assert len(rank.steps) == 3
