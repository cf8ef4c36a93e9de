"""Trials that verify they did what they say (issue 27, item 4): turning checkpointing off counts every
checkpointed call up to the first optimizer step; one that still ran, or a torch whose checkpoint functions
cannot be counted, makes the fix "not applied" (never "within noise"), in every process of the window."""

from __future__ import annotations

import types

import pytest
import torch
import torch.utils.checkpoint as ckpt

from pitstop.remedies import remedy
from pitstop.remedies.no_checkpointing import checkpoint_counter, off_or_why
from pitstop.trials.request import FixReport
from pitstop.tune.verdict import judge, make_baseline
from pitstop.tune.window import Window


@pytest.fixture
def restored() -> object:
    """The counter wraps torch's own functions: put them back after the test."""
    forward = ckpt.CheckpointFunction.forward
    generator = ckpt._checkpoint_without_reentrant_generator
    yield ckpt
    ckpt.CheckpointFunction.forward = forward  # type: ignore[method-assign]
    ckpt._checkpoint_without_reentrant_generator = generator


def test_both_kinds_of_checkpoint_are_counted(restored: types.ModuleType) -> None:
    calls = checkpoint_counter(restored)
    assert calls == [0]
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    ckpt.checkpoint(layer, x, use_reentrant=True).sum().backward()
    ckpt.checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert calls == [2]
    assert "still ran (2 checkpointed calls" in (off_or_why(calls, applied=True) or "")
    assert "tune cannot turn off" in (off_or_why(calls, applied=False) or "")
    layer(x).sum().backward()  # no checkpoint: nothing counted
    assert calls == [2]


def test_off_is_verified_only_when_nothing_was_checkpointed() -> None:
    assert off_or_why([0], applied=True) is None
    assert "could not verify" in (off_or_why([-1], applied=True) or "")
    bare = types.ModuleType("torch.utils.checkpoint")  # a torch without the functions it counts
    assert checkpoint_counter(bare) == [-1]


def test_a_revoked_fix_is_not_applied_not_within_noise() -> None:
    base = make_baseline([_window(1000.0), _window(1002.0)], 1e-3)
    w = _window(1001.0, fix="no_checkpointing")
    w.applied = {}
    w.revoked = {"no_checkpointing": "checkpointing still ran (48 checkpointed calls before the first step)"}
    v = judge(remedy("no_checkpointing"), "needless_recompute", w, base, 1e-3)
    assert v.status == "not applied" and not v.kept and v.speedup is None
    assert "still ran" in v.reason


def test_revoking_records_why_and_leaves_the_applied_list(tmp_path: object) -> None:
    report = FixReport(None)
    report.apply("no_checkpointing", "gradient_checkpointing_enable() on LlamaForCausalLM skipped")
    report.revoke("no_checkpointing", "could not verify that checkpointing was off")
    assert "no_checkpointing" not in report.applied
    assert report.revoked == {"no_checkpointing": "could not verify that checkpointing was off"}


def _window(rate: float, fix: str = "-") -> Window:
    w = Window(fixes=(fix,), real_tokens_per_s=rate, spread=0.01, losses=[6.9, 6.8])
    w.applied = {fix: "done"}
    return w
