"""GPU confirmations (issue 19): every test here is marked ``gpu`` and skipped without a CUDA device.

Each test may record measured figures with the ``figure`` fixture; ``bench/gpu_check.py`` collects them
(through $PITSTOP_GPU_FIGURES) into one pass/fail table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

FIGURES: dict[str, dict[str, Any]] = {}


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="no CUDA GPU")
    available = cuda_available()
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if not available:
                item.add_marker(skip)


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Iterator[Callable[[str, Any], None]]:
    found: dict[str, Any] = {}
    FIGURES[request.node.name] = found

    def record(name: str, value: Any) -> None:
        found[name] = value

    yield record


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("PITSTOP_GPU_FIGURES")
    if path and FIGURES:
        Path(path).write_text(json.dumps(FIGURES, indent=1, default=str))


def observe(train: Callable[[], None], warmup: int = 2, steps: int = 6) -> Any:
    """Run ``train`` under an in-process probe; the RankProfile of its measured steps."""
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    done: list[Any] = []
    probe = Probe(ProbeConfig(warmup=warmup, steps=steps, announce=False), on_done=done.append).install()
    try:
        train()
    finally:
        if not probe.finished:
            probe.finish(reason="exit")
        probe.hooks.remove()
    assert done, f"the probe produced no profile ({probe.errors})"
    return done[0]


def tiny_llama(device: Any, attn: str = "sdpa", **overrides: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    cfg.update(overrides)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type", "llama"), **cfg)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if attn.startswith("flash") else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
    return model.to(device)
