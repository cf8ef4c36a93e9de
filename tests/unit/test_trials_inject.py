"""The fixes tune applies inside a job: each keeps what it promises to keep (same examples, same labelled
tokens, same losses), and each refuses the jobs it cannot handle instead of guessing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pitstop.remedies.arming import patch_dataloader, patch_training_arguments  # noqa: E402
from pitstop.remedies.group_by_length import EpochGroupedBatchSampler, example_length  # noqa: E402
from pitstop.remedies.micro_batch import largest_factor  # noqa: E402
from pitstop.trials.collate import first_fit, pack_batch, right_padded_lengths, trim_padding  # noqa: E402
from pitstop.trials.pretokenize import build_cache, build_packed  # noqa: E402
from pitstop.trials.request import FixReport, FixRequest  # noqa: E402

PAD = 0


def padded_batch(lengths: list[int], width: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.tensor([rng.randrange(3, 200) for _ in range(n)])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def tiny_llama(attn: str) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=200,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_trimmed_and_packed_batches_give_the_same_loss(attn: str) -> None:
    batch = padded_batch([5, 17, 9, 30], width=64)
    model = tiny_llama(attn)
    with torch.no_grad():
        full = model(**{k: v.clone() for k, v in batch.items()}).loss
        trimmed = model(**trim_padding({k: v.clone() for k, v in batch.items()})).loss
        packed = model(**pack_batch({k: v.clone() for k, v in batch.items()}, attn, PAD)).loss
    assert float(trimmed) == pytest.approx(float(full), rel=1e-5)
    assert float(packed) == pytest.approx(float(full), rel=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_dense_mask_packs_rows_no_wider_than_the_padded_ones_and_keeps_the_loss(attn: str) -> None:
    """With a dense mask a row's attention costs its width squared: rows of at most the padded width (here
    32: 5+17+9 in one, 30 alone) rather than one row of all 61 tokens, and the same loss."""
    batch = padded_batch([5, 17, 9, 30], width=32)
    model = tiny_llama(attn)
    packed = pack_batch({k: v.clone() for k, v in batch.items()}, attn, PAD)
    assert packed["input_ids"].shape == (2, 31)
    assert packed["position_ids"][1, :30].tolist() == list(range(30))
    with torch.no_grad():
        full = model(**{k: v.clone() for k, v in batch.items()}).loss
        assert float(model(**packed).loss) == pytest.approx(float(full), rel=1e-5)
    assert first_fit([0, 1, 2, 3], [5, 17, 9, 30], None) == [[0, 1, 2, 3]]  # varlen attention: one row
    assert first_fit([0, 1, 2, 3], [20, 20, 10, 12], 32) == [[0, 2], [1, 3]]
    empty = padded_batch([0, 0], width=8)
    assert pack_batch(empty, attn, PAD) is empty  # every row padding: nothing to pack, the batch as it was


def test_trim_cuts_only_columns_that_are_padding_everywhere() -> None:
    batch = trim_padding(padded_batch([3, 7], width=16))
    assert batch["input_ids"].shape == (2, 7) and batch["labels"].shape == (2, 7)
    assert int(batch["attention_mask"].sum()) == 10


def test_left_padding_and_maskless_batches_are_left_alone() -> None:
    batch = padded_batch([3, 7], width=16)
    left = {k: v.flip(1) for k, v in batch.items()}
    assert right_padded_lengths(left) is None
    assert trim_padding(left)["input_ids"].shape == (2, 16)
    no_mask = {"input_ids": batch["input_ids"]}
    assert trim_padding(no_mask)["input_ids"].shape == (2, 16)
    extra = dict(batch, token_type_ids=torch.zeros_like(batch["input_ids"]))
    assert pack_batch(extra, "sdpa") is extra  # a key packing would not know how to lay out


def test_packed_row_holds_each_example_once_with_positions_restarting() -> None:
    batch = padded_batch([4, 6], width=10)
    packed = pack_batch(batch, "flash_attention_2", PAD)
    assert packed["input_ids"].shape == (1, 10)
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]
    assert packed["labels"][0, 0] == -100 and packed["labels"][0, 4] == -100  # no prediction across examples
    assert packed["cu_seq_lens_q"].tolist() == [0, 4, 10]


class TextRows:
    """A text dataset and a collate that tokenizes like a hand-written SFT script."""

    def __init__(self, n: int) -> None:
        rng = random.Random(1)
        self.texts = [
            " ".join(f"w{rng.randrange(3, 60)}" for _ in range(rng.randint(2, 20))) for _ in range(n)
        ]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict[str, str]:
        return {"text": self.texts[i]}


def word_ids(text: str) -> list[int]:
    return [int(w[1:]) for w in text.split()]


def pad_collate(width: int | None) -> Any:
    def collate(examples: list[dict[str, str]]) -> dict[str, Any]:
        rows = [word_ids(e["text"]) for e in examples]
        n = width or max(len(r) for r in rows)
        ids = torch.tensor([r + [PAD] * (n - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return collate


@pytest.mark.parametrize("width", [32, None])
def test_cache_is_the_jobs_own_collate_exactly(width: int | None) -> None:
    data, collate = TextRows(50), pad_collate(width)
    built = build_cache(data, collate, batch_size=4, seed=0)
    assert not isinstance(built, str), built
    cached, stack, _ = built
    for picked in ([0, 1, 2, 3], [7, 30, 2, 49]):
        want, got = collate([data[i] for i in picked]), stack([cached[i] for i in picked])
        assert all(torch.equal(want[k], got[k]) for k in want)


def test_cache_refuses_a_collate_that_looks_across_rows() -> None:
    def batch_dependent(examples: list[dict[str, str]]) -> dict[str, Any]:
        out = pad_collate(None)(examples)
        out["input_ids"] = out["input_ids"] + len(examples)  # depends on the batch, not the row
        return out

    assert "does not build each row on its own" in str(build_cache(TextRows(20), batch_dependent, 4, 0))


def test_packed_dataset_keeps_every_real_token_and_label() -> None:
    data, collate = TextRows(40), pad_collate(32)
    built = build_packed(data, collate, batch_size=4, seed=0)
    assert not isinstance(built, str), built
    packed, _ = built
    assert len(packed) < len(data)
    rows = [packed[i] for i in range(len(packed))]
    assert all(int(r["input_ids"].numel()) <= 32 for r in rows)
    tokens = sorted(tuple(t.tolist()) for r in rows for t in r["input_ids"].split(r["seq_lens"]))
    assert tokens == sorted(tuple(word_ids(t)) for t in data.texts)


def test_example_lengths_and_grouped_sampler_cover_every_index() -> None:
    assert example_length({"input_ids": [1, 2, 3]}) == 3
    assert example_length({"input_ids": [1, 2, 0], "attention_mask": [1, 1, 0]}) == 2
    assert example_length({"text": "hello"}) is None
    sampler = EpochGroupedBatchSampler([random.Random(i).randint(1, 99) for i in range(100)], 8, 0, False)
    first, second = list(sampler), list(sampler)
    assert sorted(i for b in first for i in b) == list(range(100))
    assert first != second  # a new grouping every epoch


@pytest.fixture
def restore_dataloader() -> Iterator[None]:
    original = torch.utils.data.DataLoader.__init__
    yield
    torch.utils.data.DataLoader.__init__ = original


def test_loader_fixes_rewrite_the_constructor_once(restore_dataloader: None, tmp_path: Any) -> None:
    request = FixRequest(fixes=frozenset({"workers", "trim_padding", "group_by_length"}))
    report = FixReport(tmp_path / "report.json")
    patch_dataloader(request, report)
    data = [{"input_ids": list(range(1, n + 1))} for n in (3, 9, 4, 12, 5, 6, 7, 8)]

    def collate(rows: list[dict[str, list[int]]]) -> dict[str, Any]:
        return pad_collate(16)([{"text": " ".join(f"w{t}" for t in r["input_ids"])} for r in rows])

    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate)
    assert loader.num_workers >= 1 and loader.persistent_workers
    assert isinstance(loader.batch_sampler, EpochGroupedBatchSampler)
    rebuilt = torch.utils.data.DataLoader(
        data, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn
    )
    assert rebuilt.collate_fn is loader.collate_fn  # an Accelerate-style rebuild is not wrapped twice
    assert set(report.applied) == {"workers", "trim_padding", "group_by_length"}
    loader.num_workers = 0  # read one batch in this process
    batch = next(iter(loader))
    assert batch["input_ids"].shape[1] < 16


def test_training_arguments_trade_accumulation_for_micro_batch(tmp_path: Any) -> None:
    from transformers import training_args

    class Args(training_args.TrainingArguments):  # patch a subclass: the real class stays untouched
        pass

    class Module:
        TrainingArguments = Args

    request = FixRequest(fixes=frozenset({"micro_batch", "no_checkpointing"}), scratch=tmp_path)
    report = FixReport(None)
    patch_training_arguments(Module, request, report)
    args = Args(
        output_dir="keep-me",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=6,
        gradient_checkpointing=True,
        use_cpu=True,
        report_to="none",
    )
    # the largest factor of 6 up to 4 is 3: the same 12 examples per optimizer step
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (6, 2)
    assert not args.gradient_checkpointing
    assert args.output_dir.startswith(str(tmp_path)) and "keep-me" in report.redirected[0]
    assert largest_factor(6, 4) == 3 and largest_factor(8, 4) == 4 and largest_factor(7, 4) == 1


def test_request_travels_through_the_environment(tmp_path: Any) -> None:
    request = FixRequest(
        fixes=frozenset({"pack", "attention"}),
        attn="eager",
        scratch=tmp_path,
        loss_steps=3,
        report_dir=tmp_path,
    )
    back = FixRequest.from_env(request.to_env())
    assert back == request
    assert FixRequest.from_env({}) is None


def test_cache_learns_the_jobs_pad_id_from_its_batches() -> None:
    def pad_with_seven(examples: list[dict[str, str]]) -> dict[str, Any]:
        rows = [word_ids(e["text"]) for e in examples]
        n = max(len(r) for r in rows)
        ids = torch.tensor([r + [7] * (n - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    data = TextRows(40)
    built = build_cache(data, pad_with_seven, batch_size=6, seed=3)
    assert not isinstance(built, str), built
    cached, stack, _ = built
    assert stack.pad_values["input_ids"] == 7
    picked = [0, 5, 9, 33]
    want, got = pad_with_seven([data[i] for i in picked]), stack([cached[i] for i in picked])
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_trial_outputs_keep_their_layout_under_scratch(tmp_path: Any) -> None:
    from pitstop.trials.outputs import redirected

    scratch = tmp_path / "scratch"
    assert redirected("/home/me/run/best.pt", scratch) == scratch / "saved" / "home/me/run/best.pt"
    assert redirected("out/step-20", scratch) == scratch / "saved" / "out/step-20"
    inside = scratch / "trainer_output" / "x.pt"
    assert redirected(inside, scratch) == inside


def test_a_loader_fix_that_fails_leaves_the_loader_as_it_was(restore_dataloader: None, tmp_path: Any) -> None:
    def refuses_one_example(rows: list[dict[str, str]]) -> dict[str, Any]:
        if len(rows) < 2:
            raise RuntimeError("needs a whole batch")
        return pad_collate(None)(rows)

    report = FixReport(tmp_path / "r.json")
    patch_dataloader(FixRequest(fixes=frozenset({"pack"})), report)
    data = TextRows(12)
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=refuses_one_example)
    assert loader.dataset is data and "needs a whole batch" in report.skipped["pack"]
    assert next(iter(loader))["input_ids"].shape[0] == 4


# How the probe reaches a job's processes (runner.inject, probe.autoload, probe.bootstrap)

import subprocess  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

from pitstop.probe import bootstrap  # noqa: E402
from pitstop.probe.autoload import PTH_NAME  # noqa: E402
from pitstop.runner.collect import collect  # noqa: E402
from pitstop.runner.inject import blind_spot, interpreter_flags  # noqa: E402
from pitstop.runner.launch import Launch  # noqa: E402

PTH = Path(bootstrap.__file__).parent / "_inject" / PTH_NAME


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["python", "-I", "t.py"], {"I"}),
        (["python3.11", "-uE", "t.py", "-S"], {"u", "E"}),  # the script's own -S is not the interpreter's
        (["python", "-X", "dev", "-S", "t.py"], {"X", "S"}),
        (["python", "-W", "ignore", "t.py"], {"W"}),
        (["env", "A=1", "python", "-s", "t.py"], {"s"}),
        (["python", "-m", "torch.distributed.run", "-S"], set()),
    ],
)
def test_interpreter_flags_are_read_up_to_the_script(command: list[str], flags: set[str]) -> None:
    found = interpreter_flags(command)
    assert found is not None and found[1] == flags


@pytest.mark.slow
def test_launchers_and_plain_pythons_have_no_blind_spot() -> None:
    assert interpreter_flags(["torchrun", "--nproc_per_node", "2", "t.py"]) is None
    assert blind_spot([sys.executable, "t.py"]) is None
    # pitstop is installed here, so its .pth arms the probe whatever -I and -E do to PYTHONPATH
    assert blind_spot([sys.executable, "-I", "t.py"]) is None


def test_python_S_is_blind_and_says_what_to_do() -> None:
    line = blind_spot([sys.executable, "-S", "t.py"])
    assert line is not None and "-S skips" in line and "pitstop.watch()" in line


@pytest.mark.slow
def test_I_and_E_are_blind_only_in_an_interpreter_without_pitstop(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    for flag in ("-I", "-E"):
        line = blind_spot([bare, flag, "t.py"])
        assert line is not None and f"{flag} makes" in line and "where-it-runs.md" in line
    assert blind_spot([bare, "t.py"]) is None  # PYTHONPATH's sitecustomize reaches it


def test_the_pth_is_one_import_line_that_does_nothing_without_pitstops_variable() -> None:
    lines = PTH.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import ")  # site runs only lines that start so
    env: dict[str, str] = {}
    exec(lines[0].replace("os.environ", "env"), {"env": env})  # no PITSTOP_OUT: nothing imported or armed


def test_arming_twice_in_one_process_arms_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bootstrap, "_armed_via", "pth")
    seen: list[str] = []
    monkeypatch.setattr(bootstrap, "after_import", lambda name, _cb: seen.append(name))
    assert bootstrap.arm({"PITSTOP_OUT": str(tmp_path)}, via="sitecustomize") is True
    assert seen == []  # the second arming installed nothing


def test_an_armed_ray_driver_carries_pitstops_variables_in_runtime_env() -> None:
    calls: list[dict[str, Any]] = []
    ray = types.ModuleType("ray")
    ray.init = lambda **kwargs: calls.append(kwargs)  # type: ignore[attr-defined]
    env = {"PITSTOP_OUT": "/shared/out", "PITSTOP_STEPS": "9", "PITSTOP_RUNNER_PID": "1", "HOME": "/root"}
    bootstrap._carry_into_ray(ray, env)
    ray.init(runtime_env={"env_vars": {"PITSTOP_STEPS": "3"}, "pip": ["x"]})
    assert calls[0]["runtime_env"] == {
        "env_vars": {"PITSTOP_OUT": "/shared/out", "PITSTOP_STEPS": "3"},
        "pip": ["x"],
    }


def test_deepspeeds_launcher_exports_pitstops_prefix_to_other_nodes() -> None:
    runner = types.ModuleType("deepspeed.launcher.runner")
    runner.EXPORT_ENVS = ["MLFLOW", "PYTHON"]  # type: ignore[attr-defined]
    bootstrap._carry_into_deepspeed(runner)
    bootstrap._carry_into_deepspeed(runner)
    assert runner.EXPORT_ENVS == ["MLFLOW", "PYTHON", "PITSTOP_"]  # type: ignore[attr-defined]


def test_a_launchers_workers_that_never_report_are_named(tmp_path: Path) -> None:
    (tmp_path / "armed-7").write_text("python train_ray.py\nvia pth\n")
    (tmp_path / "launchers-7").write_text("ray")
    outcome = collect(Launch(command=["python", "train_ray.py"], out_dir=tmp_path, exit_code=0), 10, 2)
    assert outcome.profile is None and outcome.exit_code == 2
    assert outcome.message == (
        "no rank reported: Ray did not pass PITSTOP_OUT (and pitstop's other PITSTOP_ variables) to its "
        "workers; see docs/where-it-runs.md"
    )
