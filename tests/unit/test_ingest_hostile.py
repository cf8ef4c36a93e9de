"""Issue 14's hostile inputs, each reproduced: non-finite and negative numbers, resource bombs, path tricks,
and a real checkpoint folder. Each ends in a result with the limitation said, or one line and exit 2."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from tests.conftest import run_pitstop

from pitstop.artifacts import IngestError
from pitstop.core.findings import Finding, Fix
from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.nvidia_smi import MAX_GPUS, read_smi

SMI_HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "intermediate_size": 128,
}


def _one_line_exit_2(proc: object) -> str:
    assert proc.returncode == 2, proc.stderr  # type: ignore[attr-defined]
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    return str(err)


# --- 9: non-finite and negative values never reach a finding ----------------------------------------------


def test_negative_and_huge_gpu_utilisation_is_dropped_and_said(tmp_path: Path) -> None:
    rows = [
        f"2026/01/03 10:00:{t:02d}.000, 0, {util}, 100 MiB, 81559 MiB"
        for t, util in enumerate(["-5 %", "250 %", "9" * 400 + " %"] * 10 + ["40 %"] * 30)
    ]
    path = tmp_path / "smi.csv"
    path.write_text(SMI_HEADER + "\n" + "\n".join(rows) + "\n")
    profile = load_run(Inputs(paths=[path]))
    utils = [s.util for s in profile.ranks[0].gpu_samples if s.util is not None]
    assert utils == [40.0] * 30
    assert any("30 values out of range ignored" in n for n in profile.notes)
    d = diagnose(profile)
    assert d.metrics.gpu_util == pytest.approx(0.40)
    json.dumps(d.to_dict(), allow_nan=False)


def test_trainer_state_with_nan_inf_and_negative_figures(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(
        '{"global_step": 100, "total_flos": -1e18, "log_history": ['
        '{"loss": NaN, "step": 10}, {"loss": Infinity, "step": 20},'
        '{"train_runtime": -30.0, "train_samples_per_second": -Infinity, "num_input_tokens_seen": 1e400,'
        ' "step": 100}]}'
    )
    profile = load_run(Inputs(paths=[path]))
    totals = profile.totals
    assert totals is not None and totals.steps == 100
    assert totals.train_s is None and totals.samples_per_s is None
    assert totals.tokens is None and totals.hf_total_flos is None
    assert any("4 values not a finite number" in n for n in profile.notes)
    assert any("2 negative or non-finite" in n for n in profile.notes)  # runtime and flos
    json.dumps(diagnose(profile).to_dict(), allow_nan=False)  # raises on any NaN or infinity left


def test_config_with_nan_huge_and_negative_counts(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    path.write_text(
        '{"output_dir": "o", "per_device_train_batch_size": NaN, "gradient_accumulation_steps": -4,'
        ' "dataloader_num_workers": 1e400, "max_seq_length": 99999999999999, "logging_steps": "²"}'
    )
    profile = load_run(Inputs(paths=[path], configs_only=True))
    env = profile.run_environment
    assert env.micro_batch_size is None and env.grad_accum_steps is None
    assert env.dataloader.num_workers is None and env.max_seq_len is None and env.logging_steps is None
    assert any("2 values not a finite number" in n for n in profile.notes)
    assert any(
        "out-of-range values ignored (gradient_accumulation_steps, max_seq_length)" in n
        for n in profile.notes
    )


def test_hf_defaults_of_minus_one_are_not_reported(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"output_dir": "o", "max_steps": -1, "local_rank": -1, "logging_steps": 5}))
    profile = load_run(Inputs(paths=[path], configs_only=True))
    assert profile.run_environment.logging_steps == 5
    assert not any("out-of-range" in n for n in profile.notes)


@pytest.mark.parametrize(
    ("speedup", "confidence", "want"),
    [
        (math.nan, 0.5, (None, 0.5)),
        (math.inf, math.nan, (None, 0.0)),
        (-math.inf, 7.0, (None, 1.0)),
        (0.5, -1, (1.0, 0.0)),
    ],
)
def test_a_finding_never_holds_a_non_finite_number(
    speedup: float, confidence: float, want: tuple[float | None, float]
) -> None:
    f = Finding(
        cause="idle_gpu",
        severity="low",
        confidence=confidence,
        summary="s",
        evidence={"share": math.nan, "ranks": [1.0, math.inf], "nested": {"x": -math.inf, "n": 3}},
        est_speedup=speedup,
        speedup_basis="b",
        fix=Fix(text="t"),
    )
    assert (f.est_speedup, f.confidence) == want
    assert f.evidence == {"share": None, "ranks": [1.0, None], "nested": {"x": None, "n": 3}}
    json.dumps(f.to_dict(), allow_nan=False)


# --- 11: bounded cost, one line + exit 2 ---------------------------------------------------------------------


def test_a_log_of_more_gpus_than_any_job_is_capped_and_said(tmp_path: Path) -> None:
    n = MAX_GPUS + 500
    path = tmp_path / "smi.csv"
    path.write_text(
        SMI_HEADER + "\n" + "".join(f"2026/01/03 10:00:00.000, {i}, 50 %, 1 MiB, 2 MiB\n" for i in range(n))
    )
    log = read_smi(path)
    assert len(log.gpus) == MAX_GPUS
    assert any(f"more than {MAX_GPUS} GPUs" in n and "500 rows" in n for n in log.notes)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("deep.json", '{"output_dir": ' + "[" * 1500 + "]" * 1500 + "}", "nested more than 64"),
        ("deep2.json", '{"output_dir": "o", "x": ' + "[" * 200 + "]" * 200 + "}", "nested more than 64"),
        ("deep.yaml", "output_dir: " + "[" * 5000 + "]" * 5000, "nest"),
        ("deep2.yaml", "output_dir: " + "[" * 100 + "]" * 100, "nested more than 64"),
        ("big.yaml", "output_dir: " + "x" * 5 * 2**20, "YAML larger than 4 MiB"),
        ("cycle.yaml", "output_dir: &a [*a]\nlearning_rate: 1\n", "nested more than 64"),
        ("bigint.yaml", "output_dir: o\nlogging_steps: " + "9" * 5000 + "\n", "not valid YAML"),
        ("bigint.json", '{"output_dir": "o", "logging_steps": ' + "9" * 5000 + "}", "invalid JSON"),
        ("heads0.json", json.dumps(LLAMA | {"num_attention_heads": 0}), "num_attention_heads is 0"),
        ("abc.json", json.dumps(LLAMA | {"hidden_size": "abc"}), "hidden_size is 'abc'"),
        ("neg.json", json.dumps(LLAMA | {"num_hidden_layers": -2}), "num_hidden_layers is -2"),
        ("nan.json", json.dumps(LLAMA | {"vocab_size": math.nan}), "no usable vocab_size"),
        (
            "huge.json",
            '{"model_type": "llama", "hidden_size": 1e400, "vocab_size": 3}',
            "no usable hidden_size",
        ),
        (
            "text.json",
            json.dumps({"model_type": "llava", "text_config": [1], "hidden_size": 3}),
            "text_config is list",
        ),
    ],
)
def test_hostile_documents_end_in_one_line(tmp_path: Path, name: str, content: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(IngestError) as err:
        load_run(Inputs(paths=[path]))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_deep_config_says_the_same_under_a_raised_recursion_limit(tmp_path: Path) -> None:
    """Libraries a job imports raise the recursion limit (torch.compile does): the JSON decoder then takes
    1,500 levels and the depth check refuses them, with the words the decoder's RecursionError gives."""
    import sys

    path = tmp_path / "deep.json"
    path.write_text('{"output_dir": ' + "[" * 1500 + "]" * 1500 + "}")
    words, default = [], sys.getrecursionlimit()
    try:
        for limit in (default, 10_000):
            sys.setrecursionlimit(limit)
            with pytest.raises(IngestError) as err:
                load_run(Inputs(paths=[path]))
            words.append(str(err.value))
    finally:
        sys.setrecursionlimit(default)
    assert words[0] == words[1] and "nested more than 64 levels" in words[0]


@pytest.mark.slow
def test_cli_model_option_and_files_exit_2_on_bad_model_configs(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(LLAMA | {"num_attention_heads": 0}))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": "o", "logging_steps": 5}))
    assert "num_attention_heads is 0" in _one_line_exit_2(
        run_pitstop("check", str(args), "--model", str(bad))
    )
    assert "num_attention_heads is 0" in _one_line_exit_2(run_pitstop("analyze", "--no-history", str(bad)))
    assert "nested more than 64" in _one_line_exit_2(run_pitstop("check", str(deep)))
    assert "nested too deeply" in _one_line_exit_2(run_pitstop("check", str(args), "--model", str(deep)))
    assert "pseudo-file" in _one_line_exit_2(run_pitstop("check", str(args), "--model", "/proc/self/status"))


def test_a_config_over_the_size_limit_is_refused_without_parsing(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    with path.open("w") as f:
        f.write('{"output_dir": "')
        f.write("x" * (65 * 2**20))
        f.write('"}')
    with pytest.raises(IngestError, match="larger than 64 MiB"):
        load_run(Inputs(paths=[path]))


# --- 12: paths stay inside what the user named; only regular files are opened --------------------------------


def _trainer_state(path: Path) -> Path:
    path.write_text(json.dumps({"global_step": 7, "log_history": [{"train_runtime": 10.0, "step": 7}]}))
    return path


def test_a_link_out_of_the_folder_is_skipped_and_said(tmp_path: Path) -> None:
    outside = _trainer_state(tmp_path / "secret_state.json")
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "args.json").write_text(json.dumps({"output_dir": "o", "logging_steps": 5}))
    (run / "escape.json").symlink_to(outside)
    (run / "sub" / "up").symlink_to(tmp_path)  # a linked folder: never walked into
    (run / "inside.json").symlink_to(run / "args.json")  # a link that stays inside is read
    (run / "loop1").symlink_to(run / "loop2")
    (run / "loop2").symlink_to(run / "loop1")
    profile = load_run(Inputs(paths=[run]))
    assert any("loop1: a link that cannot be followed" in n for n in profile.notes)
    assert profile.totals is None  # the outside file was not read
    assert any(n.startswith("skipped escape.json: a link to") and "outside" in n for n in profile.notes)
    assert profile.run_environment.logging_steps == 5


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_fifos_and_devices_are_never_opened(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "pipe.json")
    (run / "zero.json").symlink_to("/dev/zero")
    _trainer_state(run / "trainer_state.json")
    profile = load_run(Inputs(paths=[run]))  # would block forever on the FIFO, or read /dev/zero forever
    assert profile.totals is not None and profile.totals.steps == 7
    assert any("pipe.json: not a regular file" in n for n in profile.notes)
    assert any("zero.json: a link to /dev/zero" in n for n in profile.notes)
    with pytest.raises(IngestError, match="a FIFO"):
        load_run(Inputs(paths=[run / "pipe.json"]))
    with pytest.raises(IngestError, match="a device"):
        load_run(Inputs(paths=[run / "zero.json"]))
    with pytest.raises(IngestError, match="pseudo-file"):
        load_run(Inputs(paths=[Path("/proc/self/status")]))


def test_a_deepspeed_path_outside_the_config_folder_is_not_opened(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "zero3.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    os.mkfifo(run / "fifo.json")
    for ref, said in (
        ("/etc/passwd", "lies outside the config's folder"),
        (str(tmp_path / "zero3.json"), "lies outside the config's folder"),
        ("/proc/kmsg", "lies outside the config's folder"),
        ("fifo.json", "a FIFO"),
    ):
        config = run / "axolotl.yaml"
        config.write_text(f"base_model: m\nmicro_batch_size: 2\ndeepspeed: {ref}\n")
        profile = load_run(Inputs(paths=[config], configs_only=True))
        assert profile.run_environment.zero_stage is None
        assert any(said in n for n in profile.notes), (ref, profile.notes)
    # named too, it is read
    config.write_text(f"base_model: m\nmicro_batch_size: 2\ndeepspeed: {tmp_path / 'zero3.json'}\n")
    profile = load_run(Inputs(paths=[config, tmp_path / "zero3.json"], configs_only=True))
    assert profile.run_environment.zero_stage == 3


# --- 13: a real checkpoint folder ---------------------------------------------------------------------------


@pytest.mark.slow
def test_analyze_reads_a_checkpoint_folder_and_skips_what_is_not_an_artifact(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-500"
    ckpt.mkdir()
    _trainer_state(ckpt / "trainer_state.json")
    (ckpt / "training_args.bin").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle's first bytes
    (ckpt / "optimizer.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 64)  # torch.save's zip
    (ckpt / "model.safetensors").write_bytes((8).to_bytes(8, "little") + b'{"a": 1}' + b"\x00" * 64)
    (ckpt / "config.json").write_text(json.dumps(LLAMA))
    out = tmp_path / "out.json"
    proc = run_pitstop("analyze", str(ckpt), "--json", str(out), "--no-history")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    notes = " ".join(doc["notes"])
    assert "training_args.bin" in notes and "never unpickles" in notes
    assert "optimizer.pt" in notes and "model.safetensors" in notes
    assert sorted(Path(p).name for p in doc["inputs"]) == ["config.json", "trainer_state.json"]
    # named directly, the pickle is still refused with the way to export it
    assert "never unpickles" in _one_line_exit_2(run_pitstop("analyze", str(ckpt / "training_args.bin")))


def test_a_gpu_count_beyond_any_run_is_refused() -> None:
    seed = Path(__file__).resolve().parents[1] / "fuzz" / "seeds" / "sft_args.json"
    with pytest.raises(IngestError, match="not a GPU count"):
        load_run(Inputs(paths=[seed], gpus=10**21, configs_only=True))
