"""pitstop reaches the workers that launchers start from another process tree or a clean environment:
Ray Train (a cluster the script starts, and one started before), DeepSpeed's launcher over a hostfile (its
pdsh runner, with a stand-in pdsh that runs the "remote" command in an empty environment as ssh would),
a job that resets PYTHONPATH (the autoload .pth), and a launcher that passes nothing (one clear line)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, doctor, run_pitstop

pytestmark = pytest.mark.slow

LAUNCHERS = SCRIPTS / "launchers"
BIN = Path(sys.executable).parent


def ranks(doc: dict) -> dict[int, int]:
    return {r["rank"]: r["steps"] for r in doc["ranks"]}


def test_job_that_resets_pythonpath_and_runs_python_E_is_observed_through_the_pth(tmp_path: Path) -> None:
    command = ("env", "-u", "PYTHONPATH", sys.executable, "-E", str(LAUNCHERS / "train_plain.py"), "30")
    doc, _ = doctor(tmp_path, *command, warmup=2, steps=6)
    assert ranks(doc) == {0: 6}


def test_pth_and_sitecustomize_both_present_arm_the_process_once_and_python_I_still_arms(
    tmp_path: Path,
) -> None:
    from pitstop.runner.inject import prepare_injection

    inject = prepare_injection(tmp_path / "run")
    env = {**os.environ, "PITSTOP_OUT": str(tmp_path / "run"), "PYTHONPATH": str(inject)}
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True, timeout=120)
    armed = list((tmp_path / "run").glob("armed-*"))
    assert len(armed) == 1 and armed[0].read_text().splitlines()[-1] == "via pth"
    # -I ignores PYTHONPATH (and so the sitecustomize) but not the environment the .pth reads
    subprocess.run([sys.executable, "-I", "-c", "import torch"], env=env, check=True, timeout=120)
    assert [p.read_text().splitlines()[-1] for p in (tmp_path / "run").glob("armed-*")] == ["via pth"] * 2


def test_python_S_is_refused_before_the_run_with_what_to_do() -> None:
    proc = run_pitstop("doctor", "--", sys.executable, "-S", str(LAUNCHERS / "train_plain.py"))
    assert proc.returncode == 2
    assert "-S skips Python's site initialization" in proc.stderr
    assert "pitstop.watch()" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["watch", "tune"])
def test_watch_and_tune_refuse_python_S_in_one_line_as_doctor_does(command: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    proc = run_pitstop(command, "--", sys.executable, "-S", str(script), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    refusals = [line for line in proc.stderr.splitlines() if "cannot see inside this job" in line]
    assert len(refusals) == 1 and "-S skips Python's site initialization" in refusals[0]
    assert "Traceback" not in proc.stderr and not marker.exists()


@pytest.fixture
def ray_alone() -> Iterator[None]:
    """Ray keeps one cluster per machine: ``ray.init()`` joins one that runs (and refuses ``num_cpus`` then),
    ``ray stop --force`` ends every one. So the Ray tests take turns across pytest-xdist's workers (two of
    them once ran at the same time: the script's own ``ray.init`` found the other test's cluster)."""
    with open(Path(tempfile.gettempdir()) / "pitstop-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.mark.usefixtures("ray_alone")
def test_launcher_that_passes_nothing_to_its_worker_says_no_rank_reported() -> None:
    pytest.importorskip("ray")
    proc = run_pitstop("doctor", "--quiet", "--", sys.executable, str(LAUNCHERS / "unpassed.py"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no rank reported: Ray did not pass PITSTOP_OUT" in proc.stderr
    assert "docs/where-it-runs.md" in proc.stderr


# Ray's own start-up is what a busy machine slows: the same job without pitstop took 39 s on a quiet 2-core
# machine and 249 s at load 9 (Ray Train's controller retrying its resource requests), so the Ray runs get a
# limit of their own rather than the 300 s every other run gets.
RAY_LIMIT_S = 900


@pytest.mark.usefixtures("ray_alone")
def test_ray_train_on_a_cluster_the_script_starts_reports_every_worker_as_a_rank(tmp_path: Path) -> None:
    pytest.importorskip("ray.train.torch")
    script = (sys.executable, str(LAUNCHERS / "train_ray.py"), "--steps", "30")
    doc, _ = doctor(tmp_path, *script, warmup=2, steps=6, timeout=RAY_LIMIT_S)
    assert ranks(doc) == {0: 6, 1: 6}


@pytest.mark.usefixtures("ray_alone")
def test_ray_train_on_a_cluster_started_before_gets_pitstop_through_runtime_env(tmp_path: Path) -> None:
    pytest.importorskip("ray.train.torch")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # ray 2.60's `ray start` turns token auth on
    ray = [str(BIN / "ray")]
    start = [*ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", "6393", "--num-cpus", "3"]
    subprocess.run(
        [*start, "--include-dashboard=false"], env=env, check=True, capture_output=True, timeout=RAY_LIMIT_S
    )
    try:
        script = (
            sys.executable,
            str(LAUNCHERS / "train_ray.py"),
            "--steps",
            "30",
            "--address",
            "127.0.0.1:6393",
        )
        doc, _ = doctor(
            tmp_path, *script, warmup=2, steps=6, env={"RAY_AUTH_MODE": "disabled"}, timeout=RAY_LIMIT_S
        )
    finally:
        subprocess.run([*ray, "stop", "--force"], env=env, capture_output=True, timeout=RAY_LIMIT_S)
    assert ranks(doc) == {0: 6, 1: 6}


def test_deepspeed_launcher_on_a_hostfile_carries_pitstop_to_a_node_with_an_empty_environment(
    tmp_path: Path,
) -> None:
    pytest.importorskip("deepspeed")
    (tmp_path / "hostfile").write_text("localhost slots=2\n")
    path = f"{LAUNCHERS}{os.pathsep}{os.environ.get('PATH', '')}"  # the stand-in pdsh first
    command = (
        *(str(BIN / "deepspeed"), "--hostfile", str(tmp_path / "hostfile"), "--launcher", "pdsh"),
        *("--force_multi", "--no_ssh_check", "--master_addr", "127.0.0.1", "--master_port", "29631"),
        *(str(LAUNCHERS / "train_ds.py"), "--steps", "30"),
    )
    cwd = Path(tempfile.mkdtemp(dir=tmp_path))  # no .deepspeed_env here: only EXPORT_ENVS carries pitstop
    out = tmp_path / "run.json"
    args = ("doctor", "--quiet", "--warmup", "2", "--steps", "6", "--json", str(out), "--", *command)
    proc = run_pitstop(*args, env={"PATH": path}, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ranks(json.loads(out.read_text())) == {0: 6, 1: 6}
    shutil.rmtree(cwd, ignore_errors=True)
