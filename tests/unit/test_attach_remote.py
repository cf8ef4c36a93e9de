"""pitstop attach's remote-exec path (PEP 768), its decisions on Python 3.11 where no 3.14 exists: which
reason keeps the full probe out (on a hand-made /proc), the interpreter that would make the call, the script
it sends, the window's failures and its disarm in a ``finally``, and what the probe armed by that script
leaves behind when its window never completes (nothing)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

from pitstop.attach import inject, probed, remote
from pitstop.attach.remote import Interpreter, RemoteFailed

PID = 4242


@pytest.fixture(autouse=True)
def _not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decisions below are a user's attaching to their own job; the tests run as root on some machines,
    where pitstop refuses to run a job's binary it cannot trust (the root tests set this back to 0)."""
    monkeypatch.setattr(remote.os, "geteuid", lambda: 1000)


def fake_proc(
    tmp: Path,
    exe: str = "/usr/bin/python3.14",
    cmdline: tuple[str, ...] = ("python3.14", "train.py"),
    env: dict[str, str] | None = None,
    maps: str = "",
) -> Path:
    """/proc/PID as far as the decision reads it: exe (a link), cmdline, environ, maps."""
    proc = tmp / "proc"
    d = proc / str(PID)
    d.mkdir(parents=True)
    (d / "exe").symlink_to(exe)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")
    (d / "maps").write_text(maps)
    return proc


def asker_for(version: tuple[int, int, int], built: int | None = 1, has: bool = True) -> remote.Asker:
    def ask(command: list[str]) -> Interpreter:
        ask.commands.append(command)  # type: ignore[attr-defined]
        return Interpreter(version, True, has, built)

    ask.commands = []  # type: ignore[attr-defined]
    return ask


def test_a_job_on_python_3_11_is_said_too_old(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, exe="/usr/bin/python3.11")
    caller, reason = remote.decide_one(PID, proc, asker_for((3, 11, 7)))
    assert caller is None
    assert reason == f"PID {PID} runs Python 3.11.7: sys.remote_exec (PEP 768) needs the job on 3.14 or newer"


def test_a_3_14_job_is_called_through_its_own_executable_when_pitstop_is_older(tmp_path: Path) -> None:
    """pitstop on 3.11 has no sys.remote_exec: the job's binary (/proc/PID/exe, -I -S) makes the call."""
    proc = fake_proc(tmp_path)
    ask = asker_for((3, 14, 0))
    caller, reason = remote.decide_one(PID, proc, ask)
    assert reason is None
    assert caller == [str(proc / str(PID) / "exe"), "-I", "-S"]
    assert ask.commands == [caller]  # type: ignore[attr-defined]  # asked with the very same command


def test_pitstop_on_the_jobs_version_calls_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Version = namedtuple("Version", "major minor micro releaselevel serial")
    monkeypatch.setattr(sys, "version_info", Version(3, 14, 1, "final", 0))
    monkeypatch.setattr(sys, "remote_exec", lambda pid, path: None, raising=False)
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path), asker_for((3, 14, 0)))
    assert reason is None and caller == [sys.executable, "-I", "-S"]
    # a pre-release pitstop must match the job exactly: the job's own executable makes the call instead
    monkeypatch.setattr(sys, "version_info", Version(3, 14, 0, "candidate", 1))
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path / "rc"), asker_for((3, 14, 0)))
    assert reason is None and caller == [str(tmp_path / "rc" / "proc" / str(PID) / "exe"), "-I", "-S"]


@pytest.mark.parametrize(
    ("env", "cmdline", "expected"),
    [
        (
            {"PYTHON_DISABLE_REMOTE_DEBUG": "1"},
            ("python3.14", "train.py"),
            "PYTHON_DISABLE_REMOTE_DEBUG=1 is set",
        ),
        ({}, ("python3.14", "-X", "disable_remote_debug", "train.py"), "-X disable_remote_debug"),
        ({}, ("python3.14", "-u", "-Xdisable_remote_debug", "-m", "train"), "-X disable_remote_debug"),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, ("python3.14", "-E", "train.py"), None),  # -E: env ignored
        ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, ("python3.14", "-I", "train.py"), None),
        ({"PYTHON_DISABLE_REMOTE_DEBUG": ""}, ("python3.14", "train.py"), None),  # empty: not set
        ({}, ("python3.14", "train.py", "-X", "disable_remote_debug"), None),  # the script's own argument
    ],
)
def test_the_jobs_own_switches(
    tmp_path: Path, env: dict[str, str], cmdline: tuple[str, ...], expected: str | None
) -> None:
    proc = fake_proc(tmp_path, cmdline=cmdline, env=env)
    caller, reason = remote.decide_one(PID, proc, asker_for((3, 14, 0)))
    if expected is None:
        assert reason is None and caller is not None
    else:
        assert reason is not None and expected in reason and caller is None


def test_a_build_without_remote_debugging(tmp_path: Path) -> None:
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path), asker_for((3, 14, 0), built=0))
    assert caller is None
    assert reason == f"PID {PID}'s Python 3.14.0 was built without remote debugging (--without-remote-debug)"


def test_an_application_embedding_python_is_never_run(tmp_path: Path) -> None:
    """A binary that is not a python (an app embedding libpython3.14) is not run with Python's options;
    the version comes from its mapped libpython, and pitstop on 3.11 cannot make the call itself."""
    maps = "7f00-7f10 r-xp 0 08:01 1 /opt/app/lib/libpython3.14.so.1.0\n"
    proc = fake_proc(tmp_path, exe="/opt/app/bin/serve", maps=maps)
    ask = asker_for((3, 14, 0))
    caller, reason = remote.decide_one(PID, proc, ask)
    assert ask.commands == []  # type: ignore[attr-defined]
    assert caller is None and reason is not None
    assert "pitstop runs on Python 3.11" in reason and "/opt/app/bin/serve" in reason
    old = fake_proc(tmp_path / "old", exe="/opt/app/bin/serve", maps=maps.replace("3.14", "3.12"))
    assert "runs Python 3.12" in str(remote.decide_one(PID, old, ask)[1])


def test_an_unreadable_process_is_said_unknown(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    caller, reason = remote.decide_one(PID, proc, asker_for((3, 14, 0)))
    assert (
        caller is None and reason is not None and reason.startswith(f"could not tell which Python PID {PID}")
    )


@pytest.mark.parametrize(
    ("cmdline", "flags", "xopts"),
    [
        (["python", "-u", "-X", "dev", "train.py", "-X", "nope"], {"u"}, ["dev"]),
        (["python", "-BuXfrozen_modules=off", "-c", "pass"], {"B", "u", "c"}, ["frozen_modules=off"]),
        (["python", "-W", "ignore", "-Xdisable_remote_debug", "-m", "x"], {"m"}, ["disable_remote_debug"]),
        (["python", "-Ic", "import x", "-X", "y"], {"I", "c"}, []),
        # long options are the interpreter's too: parsing goes on past them (and the value one takes)
        (
            ["python", "--check-hash-based-pycs", "always", "-X", "disable_remote_debug", "t.py"],
            set(),
            ["disable_remote_debug"],
        ),
        (["python", "-u", "--no-such-long", "-E", "t.py", "-X", "dev"], {"u", "E"}, []),
        (["python", "--", "-X", "dev"], set(), []),
        (["python"], set(), []),
    ],
)
def test_interpreter_options(cmdline: list[str], flags: set[str], xopts: list[str]) -> None:
    assert remote.interpreter_options(cmdline) == (flags, xopts)


def test_looks_like_python() -> None:
    for name in ("python", "python3", "python3.14", "python3.14t", "python3.14 (deleted)"):
        assert remote.looks_like_python(Path("/usr/bin") / name), name
    for name in ("serve", "pythonista-app", "uwsgi"):
        assert not remote.looks_like_python(Path("/usr/bin") / name), name


def test_call_errors_name_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote.procs, "yama_scope", lambda: 1)
    text = "Traceback (most recent call last):\nPermissionError: [Errno 1] Operation not permitted\n"
    line = remote.call_error(PID, text)
    assert "no ptrace permission" in line and "ptrace_scope is 1" in line and "\n" not in line
    assert remote.call_error(PID, "RuntimeError: Failed to find the PyRuntime section\n") == (
        f"sys.remote_exec on PID {PID} failed: RuntimeError: Failed to find the PyRuntime section"
    )


def test_the_scripts_compile_and_carry_their_plan(tmp_path: Path) -> None:
    plan = remote.make_plan(tmp_path, seconds=5, steps=None, now=1000.0)
    assert plan["arm_by"] == 1000.0 + remote.ARM_WAIT_S
    assert plan["expires_at"] == plan["arm_by"] + 5 + remote.GRACE_S
    assert Path(plan["pitstop_path"], "pitstop", "attach", "inject.py").exists()
    # only pitstop: never the site-packages above it (a non-editable install would lend the job all of it)
    assert [p.name for p in Path(plan["pitstop_path"]).iterdir()] == ["pitstop"]
    assert Path(plan["pitstop_path"], "pitstop").resolve() == Path(remote.__file__).resolve().parents[1]
    for action in ("arm", "disarm"):
        text = remote.script_text(action, plan, PID)
        compile(text, f"{action}.py", "exec")
        assert f"inject.{action}(plan, added, had)" in text and repr(plan) in text
    with pytest.raises(ValueError):
        remote.script_text("exec", plan, PID)


def test_a_script_that_cannot_import_pitstop_writes_its_error(tmp_path: Path) -> None:
    """The folder it appends is wrong: the import fails, the error goes to error-PID.json, sys.path and the
    job's namespace are as before, nothing is raised."""
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    plan["pitstop_path"] = str(tmp_path / "nowhere")
    text = remote.script_text("arm", plan, PID).replace(
        "from pitstop.attach import inject", "import pitstop_nope"
    )
    path_before, namespace = list(sys.path), {}  # CPython runs the script in a fresh dict (PyRun_String)
    exec(compile(text, "arm.py", "exec"), namespace)
    assert sys.path == path_before and set(namespace) == {"__builtins__"}
    error = json.loads((tmp_path / f"error-{os.getpid()}.json").read_text())
    assert error["error"].startswith("ModuleNotFoundError")


def _fake_caller(tmp: Path, on_arm: str) -> tuple[probed.Caller, list[str]]:
    """A stand-in for the remote call that answers as the job would: ``on_arm`` (refused / error) to the arm
    script, 'disarmed' to the disarm script."""
    calls: list[str] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        calls.append(script.name)
        kind = "disarmed" if script.name == "disarm.py" else on_arm
        text = json.dumps({"pid": pid, "reason": "this process has not imported torch"})
        inject.status_path(script.parent, kind, pid).write_text(text)

    return caller, calls


def test_a_refused_arm_is_the_fallbacks_reason_and_is_disarmed_anyway(tmp_path: Path) -> None:
    caller, calls = _fake_caller(tmp_path, "refused")
    decision = remote.Decision([PID], caller=["python3.14"])
    with pytest.raises(
        RemoteFailed, match=f"PID {PID} did not arm the probe: this process has not imported torch"
    ):
        probed.probe_window(decision, 2.0, caller=caller)
    assert calls == ["arm.py", "disarm.py"]  # the finally sent the disarm, and the job confirmed it


def test_a_refused_call_sends_no_disarm(tmp_path: Path) -> None:
    calls: list[str] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        calls.append(script.name)
        raise RemoteFailed(remote.call_error(pid, "PermissionError: [Errno 1] Operation not permitted"))

    with pytest.raises(RemoteFailed, match="no ptrace permission"):
        probed.probe_window(remote.Decision([PID], caller=["python3.14"]), 2.0, caller=caller)
    assert calls == ["arm.py"]


def test_rank_pids_of_a_single_process_is_itself() -> None:
    assert remote.rank_pids(os.getpid()) == [os.getpid()] or "RANK" in os.environ


# -- the probe the arm script installs, in this process (the same functions the remote call runs) ----------


def _hooks_state() -> dict[str, object]:
    import torch
    import torch.utils.data.dataloader as dl
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om

    return {
        "next": dl._BaseDataLoaderIter.__dict__["__next__"],
        "iter_init": dl._BaseDataLoaderIter.__dict__["__init__"],
        "backward": torch.autograd.backward,
        "sdpa": torch.nn.functional.scaled_dot_product_attention,
        "save": torch.save,
        "opt_hooks": (len(om._global_optimizer_pre_hooks), len(om._global_optimizer_post_hooks)),
        "module_hooks": (len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks)),
        "path": list(sys.path),
        "filters": len(__import__("warnings").filters),
    }


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pitstop-attach-watchdog" and t.is_alive()]


def test_an_armed_window_that_never_completes_is_disarmed_by_its_watchdog(tmp_path: Path) -> None:
    """No step after arming (the job stopped stepping, pitstop was killed): at expires_at the job's own
    watchdog removes the probe; no profile is written, the error says why."""
    pytest.importorskip("torch")
    before = _hooks_state()
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    plan["expires_at"] = time.time() + 0.5
    assert inject.arm(plan)
    assert _hooks_state() != before and _watchdogs()
    deadline = time.time() + 10
    while not inject.status_path(tmp_path, "disarmed", os.getpid()).exists() and time.time() < deadline:
        time.sleep(0.05)
    assert _hooks_state() == before and not _watchdogs()
    assert not inject.profile_path(tmp_path, os.getpid()).exists()
    error = json.loads(inject.status_path(tmp_path, "error", os.getpid()).read_text())
    assert "did not complete before its deadline" in error["error"]
    assert inject._armed is None


def test_disarm_removes_every_patch_and_a_late_or_second_arm_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    before = _hooks_state()
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    assert inject.arm(plan)
    other = remote.make_plan(tmp_path / "b", seconds=5, steps=None)
    (tmp_path / "b").mkdir(exist_ok=True)  # make_plan made it (its import folder)
    assert not inject.arm(other)  # one attach at a time
    refused = json.loads(inject.status_path(tmp_path / "b", "refused", os.getpid()).read_text())
    assert "another pitstop attach" in refused["reason"]
    assert inject.disarm(other) is False  # another session's token removes nothing
    assert inject.disarm(plan) is True
    assert _hooks_state() == before and not _watchdogs() and inject._armed is None
    assert inject.disarm(plan) is False  # twice: nothing left to remove, still confirmed
    late = remote.make_plan(tmp_path, seconds=5, steps=None, now=time.time() - 60)
    assert not inject.arm(late)
    assert (
        "after pitstop had stopped waiting"
        in json.loads(inject.status_path(tmp_path, "refused", os.getpid()).read_text())["reason"]
    )
    assert _hooks_state() == before


def test_forget_drops_only_what_the_script_added(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setattr(sys, "path", [*sys.path, "/added/by/script"])
    for name in ("fakepkg", "fakepkg.sub", "fakepkgother"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    inject._forget("/added/by/script", had_pitstop=False, prefix="fakepkg")
    assert "/added/by/script" not in sys.path
    assert "fakepkg" not in sys.modules and "fakepkg.sub" not in sys.modules and "fakepkgother" in sys.modules


def test_a_process_that_never_imported_torch_is_left_out_and_the_others_give_the_window(
    tmp_path: Path,
) -> None:
    """A shell script's two pythons: a logger (refuses: no torch) and the trainer (armed, writes its
    profile). The window is the trainer's; both were sent the disarm."""
    from pitstop.core.profile import RankProfile, to_jsonable

    trainer, logger = PID, PID + 1
    calls: list[tuple[int, str]] = []

    folders: list[Path] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        calls.append((pid, script.name))
        folder = script.parent
        folders.append(folder)
        if script.name == "disarm.py":
            inject.status_path(folder, "disarmed", pid).write_text(json.dumps({"pid": pid}))
        elif pid == logger:
            refused = {"pid": pid, "reason": inject.NOT_TRAINING, "not_training": True}
            inject.status_path(folder, "refused", pid).write_text(json.dumps(refused))
        else:
            armed = {"pid": pid, "python": "3.14.0", "torch": "2.9.0"}
            inject.status_path(folder, "armed", pid).write_text(json.dumps(armed))
            profile = to_jsonable(RankProfile(rank=0, local_rank=0, pid=pid))
            inject.profile_path(folder, pid).write_text(json.dumps(profile))

    decision = remote.Decision([trainer, logger], caller=["python3.14"])
    ranks, notes = probed.probe_window(decision, 2.0, caller=caller)
    assert [r.pid for r in ranks] == [trainer]
    # the logger's refused file says nothing of its disarm: both confirmed it, and the folder is gone
    assert notes[1] == "disarmed: every patch restored in the job (confirmed by each process)"
    assert not folders[0].exists()
    assert notes[0].startswith(
        f"full probe: armed in PID {trainer} by sys.remote_exec (PEP 768; Python 3.14.0"
    )
    assert sorted(calls) == [
        (trainer, "arm.py"),
        (trainer, "disarm.py"),
        (logger, "arm.py"),
        (logger, "disarm.py"),
    ]
    only_logger = remote.Decision([logger], caller=["python3.14"])
    with pytest.raises(RemoteFailed, match=f"no process of PID {logger} has imported torch"):
        probed.probe_window(only_logger, 2.0, caller=caller)


def test_an_arm_that_lands_inside_a_forward_says_later_and_installs_nothing(tmp_path: Path) -> None:
    """The probe finds the model as the first module called outside any other: armed mid-forward, it would
    take a submodule for the model. So the script, run inside a module call, asks to be sent again."""
    torch = pytest.importorskip("torch")
    before = _hooks_state()
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    answers: list[bool] = []

    class Arming(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            answers.append(inject.arm(plan))  # as if sys.remote_exec's script ran between these bytecodes
            return x

    Arming()(torch.zeros(1))
    assert answers == [False] and _hooks_state() == before and inject._armed is None
    later = json.loads(inject.status_path(tmp_path, "later", os.getpid()).read_text())
    assert later["reason"] == inject.MID_FORWARD
    assert not inject.status_path(tmp_path, "refused", os.getpid()).exists()


def test_a_later_answer_is_sent_again_until_it_arms(tmp_path: Path) -> None:
    from pitstop.core.profile import RankProfile, to_jsonable

    sent: list[str] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        sent.append(script.name)
        folder = script.parent
        if script.name == "disarm.py":
            inject.status_path(folder, "disarmed", pid).write_text("{}")
        elif sent.count("arm.py") < 3:  # mid-forward twice
            inject.status_path(folder, "later", pid).write_text(json.dumps({"reason": inject.MID_FORWARD}))
        else:
            inject.status_path(folder, "armed", pid).write_text(json.dumps({"python": "3.14.0"}))
            inject.profile_path(folder, pid).write_text(json.dumps(to_jsonable(RankProfile(pid=pid))))

    ranks, _ = probed.probe_window(remote.Decision([PID], caller=["python3.14"]), 2.0, caller=caller)
    assert [r.pid for r in ranks] == [PID] and sent == ["arm.py"] * 3 + ["disarm.py"]


def test_root_never_runs_a_binary_the_jobs_user_could_have_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pitstop as root on another user's job: running /proc/PID/exe would run that user's code as root when
    the binary (or a folder above it) is theirs. It is never run: pitstop's own interpreter makes the call
    when it matches the job's version (read from the binary's name), else the reason is the fallback's."""
    mine = (
        tmp_path / "env" / "bin" / "python3.14"
    )  # a user's venv / conda binary: owned by this (non-root) user
    mine.parent.mkdir(parents=True)
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o775)  # group-writable; and owned by its user where the tests do not run as root
    monkeypatch.setattr(remote.os, "geteuid", lambda: 0)
    ask = asker_for((3, 14, 0))
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path / "a", exe=str(mine)), ask)
    assert ask.commands == []  # type: ignore[attr-defined]  # never run, not even to ask its version
    assert caller is None and reason is not None
    assert f"pitstop runs as root and will not run PID {PID}'s executable" in reason
    owner = f"owned by uid {os.getuid()}, not root" if os.getuid() else "writable by its group or others"
    assert f"{mine} is {owner}" in reason
    Version = namedtuple("Version", "major minor micro releaselevel serial")
    monkeypatch.setattr(sys, "version_info", Version(3, 14, 1, "final", 0))
    monkeypatch.setattr(sys, "remote_exec", lambda pid, path: None, raising=False)
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path / "b", exe=str(mine)), ask)
    assert reason is None and caller == [sys.executable, "-I", "-S"] and ask.commands == []  # type: ignore[attr-defined]


def test_root_runs_a_root_owned_binary_in_root_owned_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = Path(os.path.realpath(sys.executable))
    if any(p.stat().st_uid != 0 or p.stat().st_mode & 0o022 for p in (system, *system.parents)):
        pytest.skip(f"{system} is not a root-owned install here")
    if not remote.looks_like_python(system):
        pytest.skip(f"{system.name} is not named like a python")
    monkeypatch.setattr(remote.os, "geteuid", lambda: 0)
    assert remote.untrusted_binary(PID, fake_proc(tmp_path, exe=str(system))) is None
    caller, reason = remote.decide_one(PID, fake_proc(tmp_path / "b", exe=str(system)), asker_for((3, 14, 0)))
    assert reason is None and caller == [str(tmp_path / "b" / "proc" / str(PID) / "exe"), "-I", "-S"]


def test_a_job_that_keeps_answering_later_falls_back_with_the_mid_forward_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run of the script lands mid-forward ('later'). A script re-sent after arm_by would be refused as
    late ('busy in C code'), hiding why: pitstop stops re-sending at arm_by, and a late refusal after 'later'
    answers is still said as the mid-forward reason."""
    monkeypatch.setattr(remote, "ARM_WAIT_S", 1.0)
    plans: list[dict[str, Any]] = []

    def make_plan(*args: Any, **kwargs: Any) -> dict[str, Any]:
        plans.append(remote.make_plan(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(probed, "make_plan", make_plan)
    sent: list[str] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        sent.append(script.name)
        folder = script.parent
        if script.name == "disarm.py":
            inject.status_path(folder, "disarmed", pid).write_text("{}")
        elif time.time() > plans[-1]["arm_by"]:  # as inject._refusal answers a script run after arm_by
            late = {"reason": inject.LATE, "late": True, "not_training": False}
            inject.status_path(folder, "refused", pid).write_text(json.dumps(late))
        else:
            inject.status_path(folder, "later", pid).write_text(json.dumps({"reason": inject.MID_FORWARD}))

    with pytest.raises(RemoteFailed, match=f"PID {PID} was inside a model's forward each of the"):
        probed.probe_window(remote.Decision([PID], caller=["python3.14"]), 2.0, caller=caller)
    assert sent.count("arm.py") >= 2 and sent[-1] == "disarm.py"
    # a re-send that went out just before arm_by and ran after it: still the mid-forward reason
    folder = tmp_path / "w"
    folder.mkdir()
    inject.status_path(folder, "later", PID).write_text("{}")

    def late_resend(pid: int) -> None:
        late = {"reason": inject.LATE, "late": True}
        inject.status_path(folder, "refused", pid).write_text(json.dumps(late))

    with pytest.raises(RemoteFailed, match="inside a model's forward each of the 2 times"):
        probed.wait_for(folder, [PID], "armed", time.time() + 30, True, late_resend, time.time() + 30)


def test_a_job_in_another_mount_namespace_is_said_unable_to_read_the_script(tmp_path: Path) -> None:
    """A container's or a PrivateTmp service's job sees another /tmp: the script's path names nothing there."""
    proc = fake_proc(tmp_path)
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "mnt").symlink_to("mnt:[4026531841]")
    (proc / str(PID) / "ns").mkdir()
    (proc / str(PID) / "ns" / "mnt").symlink_to("mnt:[4026532999]")
    caller, reason = remote.decide_one(PID, proc, asker_for((3, 14, 0)))
    assert caller is None
    assert reason == (
        f"PID {PID} runs in another mount namespace (mnt:[4026532999], pitstop's is mnt:[4026531841]: a "
        "container or a private /tmp): it cannot read the script pitstop writes"
    )
    (proc / str(PID) / "ns" / "mnt").unlink()
    (proc / str(PID) / "ns" / "mnt").symlink_to("mnt:[4026531841]")  # the same namespace: armed
    assert remote.decide_one(PID, proc, asker_for((3, 14, 0)))[1] is None


def test_a_probe_that_disables_itself_says_its_error_and_is_no_longer_armed(tmp_path: Path) -> None:
    """An internal error in the window disables the probe (Probe.disable: hooks removed, no on_done). The arm
    writes error-PID.json with that error at once, so pitstop's wait fails with it instead of waiting out
    the deadline and blaming too few steps; the arm and its watchdog are gone, every patch restored."""
    pytest.importorskip("torch")
    before = _hooks_state()
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    assert inject.arm(plan)
    assert inject._armed is not None
    inject._armed.probe.disable(RuntimeError("a collector broke"))
    error = json.loads(inject.status_path(tmp_path, "error", os.getpid()).read_text())
    assert (
        error["error"] == "the probe disabled itself after an internal error: RuntimeError: a collector broke"
    )
    assert inject._armed is None and not _watchdogs() and _hooks_state() == before
    with pytest.raises(
        RemoteFailed, match=f"PID {os.getpid()} was armed but gave no profile: the probe disabled"
    ):
        probed.wait_profiles(tmp_path, [os.getpid()], time.time() + 30)
    assert inject.disarm(plan) is False  # pitstop's disarm still confirmed, nothing left to remove


class _Killed(Exception):
    """What the default SIGTERM action stands for here: pitstop gone, no finally."""


def test_sigterm_during_the_window_still_disarms(tmp_path: Path) -> None:
    """SIGTERM (kill, a closed session's SIGHUP alike) while pitstop waits for the profile: it becomes a
    KeyboardInterrupt, so the finally sends the disarm; the handlers in place before come back after."""
    import signal

    def default(signum: int, frame: object) -> None:  # stands in for SIG_DFL, which would end pytest
        raise _Killed

    old = {sig: signal.signal(sig, default) for sig in (signal.SIGTERM, signal.SIGHUP)}
    sent: list[str] = []

    def caller(command: list[str], pid: int, script: Path) -> None:
        sent.append(script.name)
        if script.name == "disarm.py":
            inject.status_path(script.parent, "disarmed", pid).write_text("{}")
            return
        inject.status_path(script.parent, "armed", pid).write_text(json.dumps({"python": "3.14.0"}))
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()  # mid-window, no profile yet

    try:
        with pytest.raises(KeyboardInterrupt, match="received signal"):
            probed.probe_window(remote.Decision([PID], caller=["python3.14"]), 30.0, caller=caller)
        assert sent == ["arm.py", "disarm.py"]
        assert signal.getsignal(signal.SIGTERM) is default and signal.getsignal(signal.SIGHUP) is default
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@pytest.mark.slow
def test_a_forked_worker_does_not_inherit_the_armed_probe(tmp_path: Path) -> None:
    """A DataLoader worker forked while the probe is armed: in the child the arm is gone and the probe's
    hooks are off (its patches restored); the parent stays armed until its disarm."""
    pytest.importorskip("torch")
    before = _hooks_state()
    plan = remote.make_plan(tmp_path, seconds=5, steps=None)
    assert inject.arm(plan)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            probe = inject._armed.probe if inject._armed is not None else None
            seen = {"armed": inject._armed is not None, "restored": _hooks_state() == before}
            seen["probe_armed"] = probe is not None
            os.write(write, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(child, 0)
    try:
        assert seen == {"armed": False, "restored": True, "probe_armed": False}
        assert inject._armed is not None and inject._armed.probe.hooks.active  # the parent's window goes on
    finally:
        inject.disarm(plan)
    assert _hooks_state() == before


def test_root_gives_the_folder_away_only_after_writing_the_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, the window's folder becomes the job's user's: were it theirs before root writes arm.py, they
    could put a link there and have root overwrite any file. So the folder is handed over last."""
    order: list[str] = []
    monkeypatch.setattr(probed, "share_with", lambda path, pid: order.append(path.name))

    def caller(command: list[str], pid: int, script: Path) -> None:
        kind = "disarmed" if script.name == "disarm.py" else "refused"
        inject.status_path(script.parent, kind, pid).write_text(json.dumps({"reason": "no"}))

    with pytest.raises(RemoteFailed):
        probed.probe_window(remote.Decision([PID], caller=["python3.14"]), 2.0, caller=caller)
    assert order[:2] == ["arm.py", "disarm.py"] and order[2].startswith("pitstop-attach-")
