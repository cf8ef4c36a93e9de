"""Issue 42 in ``pitstop attach``'s sampled view: a padded, eager Trainer job is not "No finding". What its
stacks show (transformers' ``eager_attention_forward`` in the forward, a model's own ``softmax(Q·Kᵀ)``, the
DataLoader's padding collate, ``padding="max_length"`` in the job's script) fills the records the rules read
(``attention.implementation``, ``packing``), so slow_attention and padding_waste fire from the samples, each
saying in its summary what was seen, in what share of the samples, and that it was sampled, not timed.

The stacks are hand-made over files written here (a sample's line text is read from the job's file), with
the frames a Transformers 5 Trainer job shows (names and files as py-spy ``--full-filenames`` gives them)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pitstop.attach.build import build_profile
from pitstop.attach.evidence import Sources, eager_attention, padding_collate, padding_seen
from pitstop.attach.sampled import annotate
from pitstop.attach.sampler import Window, read_speedscope
from pitstop.attach.stacks import Frame, Stack, ThreadSamples
from pitstop.attach.view import job_view
from pitstop.core.findings import Finding
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.report.terminal import render

NOPID = 99_999_999  # above any pid_max: /proc knows nothing of it
SCRIPT = """\
from transformers import DataCollatorForLanguageModeling, Trainer

def tokenize(batch):
    return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=256)

def main():
    trainer = Trainer(model=model, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
"""
OWN_MODEL = """\
import torch

class Attention(torch.nn.Module):
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(self.mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return self.out(weights @ v)

class Head(torch.nn.Module):
    def forward(self, x):
        pooled = x.mean(dim=1)
        return torch.softmax(self.proj(pooled), dim=-1)
"""


@pytest.fixture
def job(tmp_path: Path) -> dict[str, str]:
    """The job's script and model, and the library files its stacks pass through (paths as py-spy names)."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    files = {
        "script": (tmp_path / "job" / "train.py", SCRIPT),
        "model": (tmp_path / "job" / "model.py", OWN_MODEL),
        "trainer": (site / "transformers" / "trainer.py", ""),
        "llama": (site / "transformers" / "models" / "llama" / "modeling_llama.py", ""),
        "collator": (site / "transformers" / "data" / "data_collator.py", ""),
        "module": (site / "torch" / "nn" / "modules" / "module.py", ""),
        "functional": (site / "torch" / "nn" / "functional.py", ""),
        "dataloader": (site / "torch" / "utils" / "data" / "dataloader.py", ""),
        "fetch": (site / "torch" / "utils" / "data" / "_utils" / "fetch.py", ""),
        "tensor": (site / "torch" / "_tensor.py", ""),
        "optim": (site / "torch" / "optim" / "optimizer.py", ""),
    }
    for path, text in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text or "\n" * 50)
    return {key: str(path) for key, (path, _) in files.items()}


def _window(stacks: list[Stack]) -> Window:
    main = ThreadSamples(pid=NOPID, tid=NOPID, name="MainThread", interval_s=0.01, stacks=stacks)
    return Window(pid=NOPID, seconds=len(stacks) * 0.01, rate_hz=100.0, threads=[main])


def _trainer_steps(job: dict[str, str], n: int, attention: Stack | None, collate: bool) -> list[Stack]:
    """n Trainer steps: a batch (the collate, or a bare fetch), forward 6 (attention in 3 of them when given),
    backward 6, optimizer 2."""
    loop = (
        Frame("<module>", job["script"], 9),
        Frame("main", job["script"], 8),
        Frame("Trainer.train", job["trainer"], 2300),
        Frame("Trainer._inner_training_loop", job["trainer"], 2500),
    )
    fetch = (
        *loop,
        Frame("_BaseDataLoaderIter.__next__", job["dataloader"], 700),
        Frame("_SingleProcessDataLoaderIter._next_data", job["dataloader"], 760),
        Frame("_MapDatasetFetcher.fetch", job["fetch"], 55),
    )
    batch = (
        (*fetch, Frame("DataCollatorForLanguageModeling.__call__", job["collator"], 40)) if collate else fetch
    )
    step = (*loop, Frame("Trainer.training_step", job["trainer"], 3800))
    forward = (
        *step,
        Frame("Module._wrapped_call_impl", job["module"], 1770),
        Frame("Module._call_impl", job["module"], 1780),
        Frame("LlamaForCausalLM.forward", job["llama"], 460),
        Frame("LlamaMLP.forward", job["llama"], 150),
    )
    backward = (*step, Frame("Tensor.backward", job["tensor"], 620))
    optimizer = (*loop, Frame("Optimizer.profile_hook_step.<locals>.wrapper", job["optim"], 500))
    out: list[Stack] = []
    for _ in range(n):
        out += [batch] * 2
        out += [forward] * 3 + [attention or forward] * 3
        out += [backward] * 6 + [optimizer] * 2
    return out


def _hf_attention(job: dict[str, str]) -> Stack:
    """A sample inside transformers' eager attention (its softmax: torch.nn.functional's Python frame)."""
    return (
        Frame("<module>", job["script"], 9),
        Frame("main", job["script"], 8),
        Frame("Trainer.train", job["trainer"], 2300),
        Frame("Trainer._inner_training_loop", job["trainer"], 2500),
        Frame("Trainer.training_step", job["trainer"], 3800),
        Frame("Module._wrapped_call_impl", job["module"], 1770),
        Frame("Module._call_impl", job["module"], 1780),
        Frame("LlamaAttention.forward", job["llama"], 280),
        Frame("eager_attention_forward", job["llama"], 230),
        Frame("softmax", job["functional"], 2140),
    )


def _diagnosed(stacks: list[Stack]) -> Diagnosis:
    view = job_view(_window(stacks))
    return annotate(diagnose(build_profile(view)), view)


def _found(diagnosis: Diagnosis) -> dict[str, Finding]:
    return {f.cause: f for f in diagnosis.findings}


def _report(diagnosis: Diagnosis) -> str:
    out = io.StringIO()
    render(diagnosis, Console(file=out, width=200))
    return out.getvalue()


def test_transformers_eager_attention_in_the_stacks_is_the_slow_attention_finding(
    job: dict[str, str],
) -> None:
    diagnosis = _diagnosed(_trainer_steps(job, 20, _hf_attention(job), collate=False))
    env = diagnosis.profile.environment
    assert env.attention.implementation == "eager" and env.model.library == "transformers"
    found = _found(diagnosis)
    attention = found["slow_attention"]
    ev = attention.evidence
    assert ev["view"] == "sampled" and ev["samples"] == 20 * 16 and ev["sampled_rank"] == 0
    assert ev["sampled_share"] == pytest.approx(3 / 16, abs=0.001)  # 3 of each step's 16 samples
    lo, hi = ev["sampled_ci95"]
    assert lo < ev["sampled_share"] < hi
    assert ev["forward_share"] == pytest.approx(0.5, abs=0.001)  # half the forward's samples
    assert ev["eager_attention_frames"] == [
        "transformers/models/llama/modeling_llama.py in eager_attention_forward"
    ]
    assert attention.confidence == pytest.approx(
        0.95 * 0.85, abs=0.001
    )  # the stacks show it; a share, not a timing
    # the caveat is in the finding, not a note: what was seen, its share, sampled not timed
    assert (
        "`transformers/models/llama/modeling_llama.py in eager_attention_forward` is in 19% of the sampled"
        in (attention.summary)
    )
    assert "Sampled, not timed" in attention.summary and "config" not in attention.summary
    assert attention.est_speedup is None and "not estimated from samples" in attention.speedup_basis
    # the fix is the attention remedy, as a loading argument of a transformers model
    assert [u.remedy for u in attention.fix.uses] == ["attention"]
    assert 'attn_implementation="sdpa"' in attention.fix.snippet
    # no collate sampled, but the job's script pads to max_length: that line alone is the padding evidence
    assert found["padding_waste"].evidence["collate"] is None
    report = _report(diagnosis)
    assert "No finding" not in report and "Eager (unfused) attention" in report
    assert not any("attention path" in note for note in diagnosis.notes)  # seen, so not "not seen"


def test_a_models_own_softmax_of_qk_is_eager_attention_and_a_heads_softmax_is_not(
    job: dict[str, str],
) -> None:
    forward = (
        Frame("<module>", job["script"], 9),
        Frame("main", job["script"], 8),
        Frame("Module._wrapped_call_impl", job["module"], 1770),
        Frame("Module._call_impl", job["module"], 1780),
    )
    own = (*forward, Frame("Attention.forward", job["model"], 8))  # torch.softmax: C, the caller's line shows
    head = (*forward, Frame("Head.forward", job["model"], 14))  # a softmax over logits: no scores above
    sources = Sources()
    assert eager_attention(own, sources) == own[-1]
    assert eager_attention(head, sources) is None
    assert eager_attention(_hf_attention(job), sources) == _hf_attention(job)[-2]

    found = _found(_diagnosed(_trainer_steps(job, 20, own, collate=False)))
    attention = found["slow_attention"]
    assert attention.evidence["eager_attention_frames"] == [f"{job['model']} in forward"]
    assert attention.fix.uses[0].params.get("hf_model") is None  # not a transformers model: the SDPA call
    assert "slow_attention" not in _found(_diagnosed(_trainer_steps(job, 20, head, collate=False)))


def test_the_collate_and_max_length_padding_are_a_padding_finding_that_says_what_would_confirm_it(
    job: dict[str, str],
) -> None:
    stacks = _trainer_steps(job, 20, _hf_attention(job), collate=True)
    assert padding_collate(stacks[0]) == "DataCollatorForLanguageModeling"
    flattening = (*stacks[0][:-1], Frame("DataCollatorWithFlattening.__call__", job["collator"], 90))
    assert padding_collate(flattening) is None  # it packs: not a padding collate
    seen = padding_seen(stacks, Sources())
    call = 'return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=256)'
    assert seen is not None and seen.max_length_lines == [(f"{job['script']}:4", call)]
    assert seen.pads_to == 256
    diagnosis = _diagnosed(stacks)
    env = diagnosis.profile.environment
    assert env.packing is False
    # the records the live probe fills: the collate, the job's tokenizer call that pads
    assert env.dataloader.collate_fn == "DataCollatorForLanguageModeling"
    assert env.dataloader.tokenizer_padding_site == f"{job['script']}:4"
    assert env.dataloader.tokenizer_padding_code == call and env.dataloader.tokenizer_pads_to == 256
    padding = _found(diagnosis)["padding_waste"]
    ev = padding.evidence
    assert ev["view"] == "sampled" and ev["padding_frac"] is None  # the pad share is in no stack
    assert ev["collate"] == "DataCollatorForLanguageModeling"
    assert ev["collate_share"] == pytest.approx(2 / 16, abs=0.001)
    assert ev["max_length_padding"] == [f"{job['script']}:4"]
    assert "pads every example to max_length" in padding.summary
    assert "Sampled, not timed" in padding.summary and "`pitstop doctor` counts it" in padding.summary
    assert padding.est_speedup is None and padding.speedup_basis.startswith("not estimated")
    assert padding.confidence < 0.5  # the rule's config-only confidence, sampled
    assert {u.remedy for u in padding.fix.uses} >= {"pack", "trim_padding"}
    assert "No finding" not in _report(diagnosis)


def test_the_collate_alone_is_enough_and_a_plain_loop_shows_neither(
    job: dict[str, str], tmp_path: Path
) -> None:
    Path(job["script"]).write_text(SCRIPT.replace('padding="max_length", ', ""))
    only_collate = _found(_diagnosed(_trainer_steps(job, 20, None, collate=True)))
    assert "slow_attention" not in only_collate  # no eager function in the forward
    padding = only_collate["padding_waste"]
    assert padding.evidence["max_length_padding"] == []
    assert "`DataCollatorForLanguageModeling` collates the batches" in padding.summary
    plain = _found(_diagnosed(_trainer_steps(job, 20, None, collate=False)))
    assert "padding_waste" not in plain and "slow_attention" not in plain


RECORDED = Path(__file__).resolve().parent / "recorded" / "attach_newcomer_trainer.json"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_a_recorded_window_of_the_newcomer_job_names_eager_attention_and_its_padding() -> None:
    """400 samples py-spy 0.4.3 took of ``tests/scripts/newcomer_trainer.py`` (Transformers 5.25, a CPU, 100
    Hz, ``--idle --nonblocking --subprocesses --full-filenames``), the main thread only, paths made neutral
    (``/job/`` is that script's folder, put back here so its lines are read as attach reads the job's)."""
    data = json.loads(RECORDED.read_text())
    for frame in data["shared"]["frames"]:
        frame["file"] = frame["file"].replace("/job/", f"{SCRIPTS}/")
    window = Window(pid=NOPID, seconds=4.0, rate_hz=100.0)
    window.threads = read_speedscope(data, 0.01)
    diagnosis = _diagnosed(window.threads[0].stacks)
    assert diagnosis.profile.environment.framework == "hf_trainer"
    found = _found(diagnosis)
    attention = found["slow_attention"]
    ev = attention.evidence
    assert ev["view"] == "sampled" and ev["attn_implementation"] == "eager" and ev["samples"] == 400
    assert ev["eager_attention_frames"] == [
        "transformers/models/llama/modeling_llama.py in eager_attention_forward"
    ]
    assert ev["sampled_share"] == pytest.approx(33 / 400, abs=0.001)  # the recording's own count
    lo, hi = ev["sampled_ci95"]
    assert lo < ev["sampled_share"] < hi and ev["forward_share"] > ev["sampled_share"]
    assert "is in 8% of the sampled stacks" in attention.summary and "Sampled, not timed" in attention.summary
    assert 'attn_implementation="sdpa"' in str(attention.fix.snippet)

    padding = found["padding_waste"]  # the forward and backward fill the window: no collate sampled in it
    script = SCRIPTS / "newcomer_trainer.py"
    line = next(
        i for i, text in enumerate(script.read_text().splitlines(), 1) if 'padding="max_length"' in text
    )
    site = f"{script}:{line}"
    assert padding.evidence["collate"] is None and padding.evidence["max_length_padding"] == [site]
    assert padding.evidence["padding_frac"] is None and "`pitstop doctor` counts it" in padding.summary
    loader = diagnosis.profile.environment.dataloader
    assert loader.tokenizer_padding_site == site and loader.tokenizer_pads_to is None  # args.max_length
    assert "No finding" not in _report(diagnosis)
