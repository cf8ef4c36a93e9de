"""The probe inside a real (tiny) training loop in this process: measures, restores torch, never breaks the run."""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pitstop.integrations.loop import watch  # noqa: E402
from pitstop.probe.probe import Probe  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.proj = torch.nn.Linear(16, 64)

    def forward(self, input_ids: Any, attention_mask: Any, labels: Any) -> Any:
        h = self.emb(input_ids)
        q = h.unsqueeze(1)
        h = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).squeeze(1)
        logits = self.proj(h)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


class Rows(torch.utils.data.Dataset):
    def __init__(self, slow_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(4, 16, (256,), generator=g).tolist()
        self.slow_s = slow_s

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.slow_s:
            time.sleep(self.slow_s)
        n = self.lengths[i]
        ids = torch.full((16,), 0)
        ids[:n] = (torch.arange(n) * 7 + i) % 63 + 1
        mask = (torch.arange(16) < n).long()
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train(steps: int, slow_s: float = 0.0) -> list[float]:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(
        Rows(slow_s), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    losses = []
    it = iter(loader)
    for _ in range(steps):
        loss = model(**next(it))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_losses_are_bit_identical_with_and_without_the_probe() -> None:
    plain = train(20)
    with watch(steps=15, warmup=3, report=False):
        observed = train(20)
    assert observed == plain  # exact, not approximate


def test_watch_measures_and_restores_torch() -> None:
    originals = (
        torch.autograd.backward,
        torch.nn.functional.scaled_dot_product_attention,
        torch.utils.data.dataloader._BaseDataLoaderIter.__next__,
        torch.Tensor.item,
    )
    with watch(steps=8, warmup=2, report=False) as session:
        train(12, slow_s=0.002)
    after = (
        torch.autograd.backward,
        torch.nn.functional.scaled_dot_product_attention,
        torch.utils.data.dataloader._BaseDataLoaderIter.__next__,
        torch.Tensor.item,
    )
    assert after == originals
    from torch.nn.modules import module as module_mod

    assert not module_mod._has_any_global_hook()  # torch.compile'd modules warn while one is left
    d = session.diagnosis
    assert d is not None and d.metrics.steps_measured == 8
    rank = d.profile.ranks[0]
    assert all(s.samples == 4 and s.tokens == 64 and s.micro_batches == 1 for s in rank.steps)
    assert d.metrics.padding_frac is not None and 0.2 < d.metrics.padding_frac < 0.7
    assert all(s.data_wait_s >= 0.008 for s in rank.steps)  # 4 examples x 2 ms of blocking reads per step
    assert all(s.wall_s >= s.data_wait_s + (s.forward_s or 0) + (s.backward_s or 0) for s in rank.steps)
    env = rank.environment
    assert env.device == "cpu" and env.framework == "pytorch"
    assert env.model.params_total == 64 * 16 + 16 * 64 + 64
    assert env.attention.sdpa_calls == 8  # one call per step, counted inside the window
    assert env.dataloader.batch_size == 4 and env.dataloader.num_workers == 0
    assert env.dataloader.examples_are_text is False
    assert rank.tokens_counted_from == "dataloader batch" and rank.steps_delimited_by == "optimizer step"


def test_a_closure_that_runs_several_forwards_is_one_step() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.Linear(32, 50))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    with watch(steps=None, warmup=0, report=False) as session:
        for _ in range(5):
            x, y = torch.randint(0, 50, (6, 4)), torch.randint(0, 50, (6,))

            def closure(x: Any = x, y: Any = y) -> Any:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    rank = session.diagnosis.profile.ranks[0]
    assert len(rank.steps) == 5 and all(s.micro_batches >= 2 for s in rank.steps)
    assert rank.tokens_counted_from == "model inputs" and rank.steps_delimited_by == "optimizer step"


def test_a_failing_probe_disables_itself_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: Probe, *args: Any) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(Probe, "on_batch", broken)
    plain = train(10)
    with watch(steps=5, warmup=2, report=False) as session:
        observed = train(10)
    assert observed == plain
    assert session.probe is not None and session.probe.disabled
    err = capsys.readouterr().err
    assert err.count("probe disabled") == 1 and "injected fault" in err
    assert torch.autograd.backward.__module__ == "torch.autograd"  # hooks removed on the spot


def test_watch_reports_partial_window_when_training_ends_early() -> None:
    with watch(steps=100, warmup=2, report=False) as session:
        train(7)
    assert session.diagnosis is not None and session.diagnosis.metrics.steps_measured == 5
