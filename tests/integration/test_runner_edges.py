"""The runner's promises: multi-rank merge, exit codes, one-line errors, Ctrl-C, a probe that fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SCRIPTS, doctor, doctor_json, run_pitstop, start_as_at_a_terminal

pytestmark = pytest.mark.slow


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def test_torchrun_two_ranks_with_a_straggler(tmp_path: Path) -> None:
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
    doc, proc = doctor(
        tmp_path, *torchrun, str(SCRIPTS / "ddp.py"), "--slow-rank", "1", "--slow-ms", "15", steps=10
    )
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["environment"]["world_size"] == 2
    assert all(r["steps"] == 10 for r in doc["ranks"])
    straggler = next(f for f in doc["findings"] if f["cause"] == "straggler")
    assert straggler["evidence"]["slow_rank"] == 1
    waits = straggler["evidence"]["data_wait_frac_per_rank"]
    assert waits["1"] > waits["0"] + 0.1
    assert "Per rank" in proc.stdout


def test_child_exit_code_is_propagated(tmp_path: Path) -> None:
    out = tmp_path / "full.json"
    proc = run_pitstop(
        "doctor",
        "--quiet",
        "--full",
        "--warmup",
        "2",
        "--json",
        str(out),
        "--",
        sys.executable,
        str(SCRIPTS / "plain_loop.py"),
        "--steps",
        "10",
        "--exit-code",
        "3",
    )
    assert proc.returncode == 3
    assert "exited with code 3" in proc.stderr
    doc = json.loads(out.read_text())  # the steps measured before the exit are still diagnosed
    assert doc["metrics"]["steps_measured"] == 8 and doc["exit_code"] == 3


def test_run_shorter_than_the_window_is_reported(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "plain_loop.py", "--steps", "8", warmup=3, steps=50)
    assert doc["metrics"]["steps_measured"] == 5
    assert any("ended after 5 measured steps" in n for n in doc["notes"])


def test_crash_before_the_first_step() -> None:
    proc = run_pitstop(
        "doctor", "--quiet", "--", sys.executable, str(SCRIPTS / "plain_loop.py"), "--crash-before-step"
    )
    assert proc.returncode == 1
    assert "exited with code 1 before its first optimizer step" in proc.stderr
    assert "planted crash" in proc.stderr  # the tail of the command's own output is shown
    assert "pitstop/" not in proc.stderr  # the traceback shown is the script's own, none from pitstop


def test_script_without_an_optimizer() -> None:
    proc = run_pitstop(
        "doctor",
        "--quiet",
        "--",
        sys.executable,
        str(SCRIPTS / "plain_loop.py"),
        "--no-optimizer",
        "--steps",
        "3",
    )
    assert proc.returncode == 2
    assert "without a training step to measure" in proc.stderr and "optimizer.step()" in proc.stderr


def test_command_that_does_not_exist() -> None:
    proc = run_pitstop("doctor", "--", "no-such-command-xyz", "--flag")
    assert proc.returncode == 127
    assert _last_line(proc) == "pitstop: cannot start `no-such-command-xyz`: command not found"


def test_program_that_never_imports_torch() -> None:
    proc = run_pitstop("doctor", "--quiet", "--", sys.executable, "-c", "print('hello')")
    assert proc.returncode == 2
    assert "no Python process of it imported torch" in proc.stderr


def test_bad_arguments_get_one_line_errors(tmp_path: Path) -> None:
    no_cmd = run_pitstop("doctor")
    assert no_cmd.returncode == 2 and "no command given" in no_cmd.stderr
    fixed = run_pitstop("doctor", "--fixed", "--", "true")
    assert fixed.returncode == 2 and "--fixed goes with --demo" in fixed.stderr
    bad_json = run_pitstop("doctor", "--json", str(tmp_path / "missing" / "x.json"), "--", "true")
    assert bad_json.returncode == 2 and "does not exist" in bad_json.stderr
    bad_steps = run_pitstop("doctor", "--steps", "0", "--", "true")
    assert bad_steps.returncode == 2
    for proc in (no_cmd, fixed, bad_json, bad_steps):
        assert "Traceback" not in proc.stderr


def test_a_failing_probe_never_takes_the_run_down() -> None:
    proc = run_pitstop("doctor", "--", sys.executable, str(SCRIPTS / "faulty_probe.py"), "--steps", "6")
    assert proc.stderr.count("probe disabled after an internal error (RuntimeError: injected fault)") == 1
    assert "the probe failed" in _last_line(proc)
    assert proc.returncode == 1


def test_ctrl_c_ends_the_whole_process_group(tmp_path: Path) -> None:
    marker = f"--seed={424242 + os.getpid()}"  # this run's own: other checkouts may run this test at once
    env = {
        **os.environ,
        "PITSTOP_CACHE": str(ROOT / ".pytest_cache" / "pitstop-cache"),
        "TMPDIR": str(tmp_path),
    }
    pitstop = start_as_at_a_terminal(
        [
            sys.executable,
            "-m",
            "pitstop",
            "doctor",
            "--warmup",
            "2",
            "--full",
            "--",
            sys.executable,
            str(SCRIPTS / "plain_loop.py"),
            "--steps",
            "100000",
            "--workers",
            "1",
            marker,
        ],
        env,
    )
    deadline = time.monotonic() + 60
    started = False
    while time.monotonic() < deadline and not started:
        time.sleep(0.5)
        ps = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True, text=True)
        started = len(ps.stdout.split()) >= 3  # pitstop, the trainer and its DataLoader worker
    assert started
    _wait_for_steps(tmp_path, 4)  # a few steps in (the rank file's step lines), however busy the machine
    pitstop.send_signal(signal.SIGINT)
    out, err = pitstop.communicate(timeout=30)
    assert pitstop.returncode == 130, err
    assert "interrupted" in err
    assert "pitstop doctor" in out  # the steps measured before Ctrl-C are diagnosed
    time.sleep(0.5)
    assert (
        subprocess.run(["pgrep", "-f", "--", marker], capture_output=True).returncode == 1
    )  # nothing left running


def _wait_for_steps(tmp_path: Path, steps: int, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for path in tmp_path.glob("pitstop-*/rank-*.jsonl"):
            if path.read_text(errors="replace").count('"kind":"step"') >= steps:
                return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach {steps} steps")


def test_causes_command_lists_the_catalogue() -> None:
    proc = run_pitstop("causes")
    assert proc.returncode == 0
    assert "dataloader_bound" in proc.stdout and "low_mfu_unexplained" in proc.stdout


def test_unchanged_steps_and_losses_under_the_runner(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    probed = tmp_path / "probed.json"
    args = [str(SCRIPTS / "plain_loop.py"), "--steps", "12", "--pad-to", "128"]
    subprocess.run([sys.executable, *args, "--losses", str(plain)], check=True, capture_output=True)
    run = tmp_path / "run.json"
    proc = run_pitstop(
        "doctor", "--quiet", "--full", "--warmup", "2", "--json", str(run),
        "--", sys.executable, *args, "--losses", str(probed),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(probed.read_text()) == json.loads(plain.read_text())  # bit-identical
    doc = json.loads(run.read_text())
    assert doc["metrics"]["steps_measured"] == 10 and doc["exit_code"] == 0  # every step after the warm-up
