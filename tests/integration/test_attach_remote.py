"""pitstop attach's full-probe path (PEP 768's sys.remote_exec) against real training loops.

No Python 3.14 exists on the machines this was written on, so the path is exercised in two ways:

* in this process: a real training loop runs in a thread, and ``probed.probe_window`` runs the very arm and
  disarm scripts that ``sys.remote_exec`` would hand to the job, executed here by a stand-in for the call.
  Everything but the kernel's part of the call (writing the script's path into the job) is the same code:
  the plan, the scripts, ``inject.arm`` / ``disarm``, the window, the profile written whole, the disarm in a
  ``finally``, and pitstop's side waiting for each;
* a real job on this interpreter (3.11), attached by PID: the fallback to sampling, with the reason said;
* live, where an interpreter >= 3.14 with torch is found (``PITSTOP_PY314``, ``python3.14`` on PATH, uv's
  managed pythons): a job started on it, attached by PID from pitstop on this interpreter (the job's own
  executable makes the call), the full probe's report, the job's exit and losses unaffected.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from pitstop.attach import probed, remote
from tests.conftest import attach_json

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "attach" / "slow_loader.py"


def _patched_state() -> dict[str, Any]:
    """Everything the probe patches or registers, to compare before arming and after disarming."""
    import torch
    import torch.utils.data.dataloader as dl
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om

    return {
        "next": dl._BaseDataLoaderIter.__dict__["__next__"],
        "iter_init": dl._BaseDataLoaderIter.__dict__["__init__"],
        "single_init": dl._SingleProcessDataLoaderIter.__dict__["__init__"],
        "backward": torch.autograd.backward,
        "sdpa": torch.nn.functional.scaled_dot_product_attention,
        "checkpoint": torch.utils.checkpoint.checkpoint,
        "save": torch.save,
        "optimizer_hooks": (len(om._global_optimizer_pre_hooks), len(om._global_optimizer_post_hooks)),
        "module_hooks": (len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks)),
        "path": list(sys.path),
        "warning_filters": len(warnings.filters),
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("pitstop")),
    }


class Loop:
    """A tiny real training loop with a planted slow loader (2 ms a batch item, num_workers=0), in a thread:
    its iterator is made before the probe is armed, as a job hours into an epoch has it."""

    def __init__(self) -> None:
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Slow(Dataset[Any]):
            def __len__(self) -> int:
                return 10**6

            def __getitem__(self, i: int) -> Any:
                time.sleep(0.002)
                return torch.randn(32), torch.randn(1)

        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loader = DataLoader(Slow(), batch_size=8, num_workers=0)
        self.losses: list[float] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="training-loop")

    def _run(self) -> None:
        import torch

        loader = self.loader  # a local of the loop's frame, where the arm script finds it
        try:
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                self.losses.append(loss.item())
                if self.stop.is_set():
                    return
        except BaseException as exc:  # the test fails on it: the probe must never reach the job
            self.error = exc


def _in_process(command: list[str], pid: int, script: Path) -> None:
    """The stand-in for sys.remote_exec(pid, script): the script's source run here in a fresh dict, as
    CPython's eval loop runs it (PyRun_String with a new namespace)."""
    assert pid == os.getpid()
    exec(compile(script.read_text(), "<string>", "exec"), {})


@pytest.mark.slow
def test_the_arm_script_probes_a_real_loop_for_one_window_and_leaves_nothing_behind() -> None:
    pytest.importorskip("torch")
    from pitstop.core.profile import RunProfile
    from pitstop.core.vocabulary import Source
    from pitstop.diagnose import counting_line, diagnose

    loop = Loop()
    before = _patched_state()
    loop.thread.start()
    try:
        while len(loop.losses) < 5:  # the loop is under way, its iterator made
            time.sleep(0.05)
        decision = remote.Decision([os.getpid()], caller=["(in process)"])
        ranks, notes = probed.probe_window(decision, seconds=1.5, caller=_in_process)
        after = _patched_state()
        at_disarm = len(loop.losses)
        while len(loop.losses) < at_disarm + 5:  # the loop runs on after the window
            time.sleep(0.05)
    finally:
        loop.stop.set()
        loop.thread.join(timeout=30)
    assert loop.error is None
    assert after == before  # every patch restored, no hook, no thread, sys.path as it was
    (rank,) = ranks
    assert rank.pid == os.getpid() and len(rank.steps) >= 5 and rank.warmup_steps == 2
    assert rank.tokens_counted_from == "dataloader batch" and rank.steps_delimited_by == "optimizer step"
    assert rank.environment.dataloader.num_workers == 0  # the loader found on the loop's stack
    assert rank.environment.framework == "pytorch"
    assert any(n.startswith(f"full probe: armed in PID {os.getpid()} by sys.remote_exec") for n in notes)
    assert "disarmed: every patch restored in the job (confirmed by each process)" in notes
    profile = RunProfile(source=Source.ATTACH, ranks=ranks)
    diagnosis = diagnose(profile)
    first = diagnosis.findings[0]
    assert first.cause == "dataloader_bound"
    assert first.evidence["num_workers"] == 0 and first.evidence["data_wait_frac"] > 0.2
    assert "view" not in first.evidence  # timed by the probe, not sampled
    assert counting_line(profile) == "counted from DataLoader batches · steps: optimizer step"


@pytest.mark.slow
def test_a_job_on_this_python_is_said_too_old_for_the_full_probe() -> None:
    """A real process on 3.11: its executable is asked, and the reason names its version."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        decision = remote.decide(job.pid)
    finally:
        job.kill()
        job.wait()
    assert decision.pids == [job.pid] and not decision.ok
    version = ".".join(map(str, sys.version_info[:3]))
    expected = (
        f"PID {job.pid} runs Python {version}: sys.remote_exec (PEP 768) needs the job on 3.14 or newer"
    )
    if sys.version_info < (3, 14):
        assert decision.reason == expected


@pytest.mark.slow
def test_the_jobs_switches_are_read_from_a_real_process() -> None:
    """PYTHON_DISABLE_REMOTE_DEBUG from /proc/PID/environ, -X disable_remote_debug from /proc/PID/cmdline
    (any interpreter accepts an -X option it does not know, so this runs on 3.11 too)."""
    sleep = ["-c", "import time; time.sleep(60)"]
    env = {**os.environ, "PYTHON_DISABLE_REMOTE_DEBUG": "1"}
    by_env = subprocess.Popen([sys.executable, *sleep], env=env)
    by_flag = subprocess.Popen([sys.executable, "-X", "disable_remote_debug", *sleep])
    try:
        time.sleep(0.3)
        assert remote.disabled_by_job(by_env.pid) == (
            f"PYTHON_DISABLE_REMOTE_DEBUG=1 is set in PID {by_env.pid}'s environment: remote debugging is off"
        )
        assert remote.disabled_by_job(by_flag.pid) == (
            f"PID {by_flag.pid} was started with -X disable_remote_debug: remote debugging is off"
        )
    finally:
        for job in (by_env, by_flag):
            job.kill()
            job.wait()


def python_314_with_torch() -> str | None:
    """An interpreter >= 3.14 that imports torch: PITSTOP_PY314, python3.14+ on PATH, uv's managed ones."""
    found = [os.environ.get("PITSTOP_PY314")]
    found += [shutil.which(f"python3.{minor}") for minor in range(14, 20)]
    found += sorted(glob.glob(os.path.expanduser("~/.local/share/uv/python/cpython-3.1[4-9]*/bin/python3.*")))
    for candidate in filter(None, found):
        check = "import sys, torch; assert sys.version_info >= (3, 14)"
        try:
            if subprocess.run([candidate, "-c", check], capture_output=True, timeout=120).returncode == 0:
                return candidate
        except (OSError, subprocess.SubprocessError):
            continue
    return None


@pytest.mark.slow
def test_live_full_probe_on_a_python_3_14_job(tmp_path: Path) -> None:
    python = python_314_with_torch()
    if python is None:
        pytest.skip("no Python >= 3.14 with torch on this machine (PITSTOP_PY314 may name one)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the job cannot import pitstop itself: the script appends its folder
    cmd = [python, str(JOB), "--seconds", "40", "--step-times", str(tmp_path / "steps.txt")]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert job.stdout is not None
        for line in job.stdout:
            if line.startswith("ready"):
                break
        time.sleep(1.0)
        out = tmp_path / "attach.json"
        doc = attach_json(job.pid, 4, out, timeout=200)
        rest, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0 and "done" in rest  # the job ran on to its own end
    notes = " ".join(doc["notes"])
    assert "full probe: armed in PID" in notes and "disarmed: every patch restored" in notes
    findings = {f["cause"]: f for f in doc["findings"]}
    assert next(iter(findings)) == "dataloader_bound"
    ev = findings["dataloader_bound"]["evidence"]
    assert ev["num_workers"] == 0 and "view" not in ev
    assert doc["ranks"][0]["tokens_counted_from"] == "dataloader batch"


@pytest.mark.slow
def test_a_shell_scripts_python_is_the_process_to_arm() -> None:
    """attach to the PID of `bash train.sh`: the python below it is armed, not the shell (nor its workers)."""
    code = "import os, time; os.fork() or time.sleep(60); time.sleep(60)"  # a python with a forked child
    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{code}'; true"])
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            kids = remote.procs.descendants(shell.pid)
            if len(kids) >= 2:
                break
            time.sleep(0.1)
        pythons = [p for p in remote.procs.descendants(shell.pid) if remote.procs.parent(p) == shell.pid]
        assert remote.rank_pids(shell.pid) == pythons and len(pythons) == 1
    finally:
        for pid in remote.procs.descendants(shell.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        shell.kill()
        shell.wait()


@pytest.mark.slow
def test_the_cli_reports_a_probed_window_as_a_doctor_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pitstop attach`'s own path (cli.attach.run_attach) on a real loop in this process: the decision and
    the call stood in for (no 3.14 here), everything after them real: the report's notes, the Counted line
    of a probed run, the JSON document."""
    pytest.importorskip("torch")
    import functools

    from pitstop.attach import procs
    from pitstop.cli.attach import run_attach

    monkeypatch.setattr(procs, "check_pid", lambda pid: None)  # it refuses pitstop's own PID
    monkeypatch.setattr(remote, "decide", lambda pid: remote.Decision([pid], caller=["(in process)"]))
    monkeypatch.setattr(probed, "probe_window", functools.partial(probed.probe_window, caller=_in_process))
    loop = Loop()
    before = _patched_state()
    loop.thread.start()
    out = tmp_path / "attach.json"
    try:
        while len(loop.losses) < 5:
            time.sleep(0.05)
        assert run_attach(os.getpid(), 1.5, 100.0, out) == 0
    finally:
        loop.stop.set()
        loop.thread.join(timeout=30)
    assert loop.error is None and _patched_state() == before
    doc = json.loads(out.read_text())
    assert doc["source"] == "attach"
    assert any(n.startswith(f"full probe: armed in PID {os.getpid()}") for n in doc["notes"])
    assert not any(n.startswith("full probe not armed") for n in doc["notes"])
    assert doc["environment"]["counted"] == "counted from DataLoader batches · steps: optimizer step"
    first = doc["findings"][0]
    assert first["cause"] == "dataloader_bound" and "view" not in first["evidence"]
