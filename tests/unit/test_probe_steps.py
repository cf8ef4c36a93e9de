"""What the probe gives each step, in loops shaped like the public scripts that showed it wrong: micro-batches
taken ahead with ``next()`` from a new iterator each epoch with evaluation between epochs (Accelerate's
gradient-accumulation example), torch's own attention modules (Lightning's demo transformer), a save after the
last step (run_clm.py's final ``save_model``). Tiny models trained in this process."""

from __future__ import annotations

import io
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pitstop.integrations.loop import watch  # noqa: E402

pytestmark = pytest.mark.slow  # trains (tiny) models

WIDTH = 12


class Rows(torch.utils.data.Dataset):
    """Rows of ``WIDTH`` positions padded after a length that differs from row to row."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(2, WIDTH + 1, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = self.lengths[i]
        ids = torch.zeros(WIDTH, dtype=torch.long)
        ids[:n] = torch.arange(1, n + 1)
        mask = (torch.arange(WIDTH) < n).long()
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(WIDTH + 1, 8)
        self.out = torch.nn.Linear(8, WIDTH + 1)

    def forward(self, input_ids: Any, attention_mask: Any, labels: Any) -> Any:
        logits = self.out(self.emb(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


@pytest.mark.parametrize("eval_style", ["model.eval()", "torch.no_grad()"])
def test_every_micro_batch_of_a_step_counts_and_eval_batches_do_not(eval_style: str) -> None:
    """Two micro-batches of 2 rows per optimizer step, both taken with ``next()`` before the first forward,
    a new iterator each epoch, an eval loader read between epochs: each step holds exactly its own rows."""
    torch.manual_seed(0)
    train = Rows(16, seed=1)
    evaluate = torch.utils.data.DataLoader(Rows(6, seed=2), batch_size=3)
    loader = torch.utils.data.DataLoader(train, batch_size=2)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(steps=None, warmup=1, report=False) as session:
        for _epoch in range(3):
            model.train()
            it = iter(loader)
            for _update in range(4):
                micro = [next(it), next(it)]
                for batch in micro:
                    model(**batch).backward()
                opt.step()
                opt.zero_grad()
            if eval_style == "model.eval()":
                model.eval()
                for batch in evaluate:  # taken with grad on: only the mode tells
                    with torch.no_grad():
                        model(**batch)
            else:
                with torch.no_grad():
                    for batch in evaluate:
                        model(**batch)
    rank = session.diagnosis.profile.ranks[0]
    per_step = [sum(train.lengths[4 * u : 4 * u + 4]) for u in range(4)] * 3  # rows 4u..4u+3 in update u
    assert [s.index for s in rank.steps] == list(range(2, 13))
    assert [s.samples for s in rank.steps] == [4] * 11
    assert [s.tokens for s in rank.steps] == [4 * WIDTH] * 11
    assert [s.real_tokens for s in rank.steps] == per_step[1:]
    assert all(s.micro_batches == 2 for s in rank.steps)
    assert rank.tokens_counted_from == "dataloader batch"


class WithTorchAttention(torch.nn.Module):
    def __init__(self, need_weights: bool | None) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.need_weights = need_weights
        if need_weights is None:  # nn.Transformer's layers call their attention with need_weights=False
            self.block: Any = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        else:
            self.block = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = torch.nn.Linear(16, 32)

    def forward(self, x: Any, y: Any) -> Any:
        h = self.emb(x)
        if self.need_weights is None:
            h = self.block(h)
        else:
            h = self.block(h, h, h, need_weights=self.need_weights)[0]
        return torch.nn.functional.cross_entropy(self.out(h).flatten(0, 1), y.flatten())


@pytest.mark.parametrize(
    ("need_weights", "expected"),
    [
        (None, "sdpa (nn.MultiheadAttention)"),
        (False, "sdpa (nn.MultiheadAttention)"),
        (True, "eager (nn.MultiheadAttention with need_weights=True)"),
    ],
)
def test_torch_attention_modules_are_named_by_the_path_they_ran(
    need_weights: bool | None, expected: str
) -> None:
    torch.manual_seed(0)
    model = WithTorchAttention(need_weights)
    opt = torch.optim.AdamW(model.parameters())
    with watch(steps=3, warmup=1, report=False) as session:
        for _ in range(5):
            x = torch.randint(0, 32, (2, 8))
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    attention = session.diagnosis.profile.ranks[0].environment.attention
    assert attention.implementation == expected
    assert (attention.sdpa_calls or 0) > 0 if expected.startswith("sdpa") else attention.sdpa_calls == 0


def test_a_save_after_the_last_step_is_not_a_stall_inside_the_loop() -> None:
    """Saves between steps land in the next step (counted); the save after the last step (and one after the
    loop, as a trainer's final save_model) stall no measured step."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(Rows(12, seed=3), batch_size=2)
    with watch(steps=None, warmup=1, report=False) as session:
        for step, batch in enumerate(loader, 1):
            model(**batch).backward()
            opt.step()
            opt.zero_grad()
            if step % 2 == 0:
                torch.save(model.state_dict(), io.BytesIO())
        torch.save(model.state_dict(), io.BytesIO())  # the final save
    rank = session.diagnosis.profile.ranks[0]
    assert len(rank.steps) == 5  # steps 2..6
    saves = rank.checkpoints
    assert saves is not None
    assert (saves.saves, saves.steps_with_saves) == (2, 2)  # after steps 2 and 4: in steps 3 and 5
    assert saves.calls == {"torch.save": 2}


def test_kernel_facts_without_an_optimizer() -> None:
    from pitstop.probe.kernels import kernel_facts

    facts = kernel_facts(None, torch.nn.Linear(2, 2), None)
    assert facts.optimizer is None and facts.optimizer_fused is None and facts.optimizer_foreach is None
    assert facts.compiled is False


def test_the_report_says_where_counts_and_steps_came_from() -> None:
    from rich.console import Console

    from pitstop.report.terminal import render

    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(Rows(12, seed=3), batch_size=2)
    with watch(steps=None, warmup=1, report=False) as session:
        for batch in loader:
            model(**batch).backward()
            opt.step()
            opt.zero_grad()
    console = Console(record=True, width=200)
    render(session.diagnosis, console)
    assert "counted from DataLoader batches · steps: optimizer step" in console.export_text()


def test_watch_and_tune_refuse_a_python_that_skips_site(tmp_path: Any) -> None:
    """runner.launch refuses what pitstop cannot see inside, for every command that runs jobs (doctor, watch,
    tune): one line, exit 2, nothing started."""
    from pitstop.probe.config import ProbeConfig
    from pitstop.runner.launch import BlindSpotError, run_observed

    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(BlindSpotError) as refused:
        run_observed(["python", "-S", str(script)], ProbeConfig(), out_dir=tmp_path / "out")
    assert refused.value.code == 2 and "\n" not in str(refused.value)
    assert str(refused.value).startswith("pitstop cannot see inside this job: -S skips Python's site")
    assert not marker.exists()
