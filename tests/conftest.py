"""Shared test helpers: paths, running the pitstop CLI in a subprocess, and hand-made RunProfiles."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child the test sends SIGINT (Ctrl-C): the default disposition a terminal's
    foreground job has, even where the suite was started with SIGINT ignored (under nohup, as a background
    job of a script, by some CI runners), which Python would otherwise keep: the child would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_as_at_a_terminal(
    cmd: list[str], env: dict[str, str], merge_stderr: bool = False, **popen: Any
) -> subprocess.Popen[str]:
    """A child the test will signal: text pipes, run from the repository, SIGINT at its default."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=sigint_as_at_a_terminal,
        **popen,
    )


SHARED = Path(os.environ.get("PITSTOP_SHARED_DATA") or ROOT.parent / "shared" / "data")  # or where it lies


@pytest.fixture(autouse=True)
def history_file(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test records into its own history file (via $PITSTOP_HISTORY), never into the user's home."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite3"
    monkeypatch.setenv("PITSTOP_HISTORY", str(path))
    return path


# What libraries start once per process to learn the platform (``platform.processor()`` runs ``uname -p``,
# ``ctypes.util.find_library`` runs ``ldconfig``): milliseconds, and whichever test comes first would pay
# for them, so they do not count as a test starting a process
PLATFORM_PROBES = frozenset({"uname", "ldconfig", "/sbin/ldconfig"})
platform.processor()  # cached for the session: whether a test runs it first no longer depends on the order


class _Spawns:
    """What a test started: commands (``subprocess``) and bare forks (``multiprocessing``, ``os.fork``)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def note(self, what: object) -> None:
        if isinstance(what, (list, tuple)):
            if what and Path(str(what[0])).name in PLATFORM_PROBES | {Path(p).name for p in PLATFORM_PROBES}:
                return
            self.started.append(" ".join(map(str, what)))
        else:
            self.started.append(str(what))


@pytest.fixture(autouse=True)
def spawning_needs_the_slow_mark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A test that starts a process costs seconds and belongs to the slow tier (``make test-all``): one that
    does so without ``@pytest.mark.slow`` fails, naming what it started, so the fast tier stays fast."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    spawns = _Spawns()
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def noted_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
        spawns.note(args)
        return execute_child(self, args, *rest, **kw)

    fork = os.fork

    def noted_fork() -> int:
        spawns.note("os.fork()")
        return fork()

    spawnv = multiprocessing.util.spawnv_passfds  # how 'spawn' and 'forkserver' start their processes

    def noted_spawnv(path: Any, args: Any, passfds: Any) -> int:
        spawns.note(args)
        return spawnv(path, args, passfds)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", noted_child)
    monkeypatch.setattr(os, "fork", noted_fork)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", noted_spawnv)
    yield
    if spawns.started:
        pytest.fail(
            f"started {len(spawns.started)} process(es) without @pytest.mark.slow: {spawns.started[0][:200]}",
            pytrace=False,
        )


def require_shared(part: str = "") -> Path:
    """``../shared/data`` (or a part of it). Skips where it is absent, except in CI (``CI=true``), which
    always has it: there a missing folder fails the test instead of skipping it silently."""
    path = SHARED / part if part else SHARED
    if not path.exists():
        reason = f"{path} is not beside this checkout"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}, and CI always has it")
        pytest.skip(reason)
    return path


@pytest.fixture
def shared_data() -> Path:
    return require_shared()


def run_pitstop(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a fresh interpreter, as a user would."""
    full_env = {
        **os.environ,
        "PITSTOP_CACHE": str(ROOT / ".pytest_cache" / "pitstop-cache"),
        "COLUMNS": "120",
    }
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pitstop", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or ROOT,
    )


def run_in_pty(
    cmd: list[str], *, rows: int, columns: int, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``cmd`` on a pseudo-terminal of ``rows`` x ``columns``, as a user at a terminal would: its exit code
    and everything it showed (stdout and stderr, as the terminal received them)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=30)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def attach_json(pid: int, seconds: int, out: Path, timeout: float = 120) -> dict[str, Any]:
    """``pitstop attach PID --for Ns --json OUT`` as a user types it (it must succeed); its JSON document."""
    done = subprocess.run(
        [sys.executable, "-m", "pitstop", "attach", str(pid), "--for", f"{seconds}s", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def doctor(
    tmp_path: Path,
    *command: str,
    warmup: int = 3,
    steps: int = 12,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``pitstop doctor --quiet --json`` on any command; returns the JSON document and the process."""
    out = tmp_path / "run.json"
    args = ["doctor", "--quiet", "--warmup", str(warmup), "--steps", str(steps), "--json", str(out), "--"]
    proc = run_pitstop(*args, *command, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc


def doctor_json(
    tmp_path: Path, script: str, *script_args: str, warmup: int = 3, steps: int = 12
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``doctor`` on one of the test scripts in tests/scripts."""
    return doctor(tmp_path, sys.executable, str(SCRIPTS / script), *script_args, warmup=warmup, steps=steps)


def causes(doc: dict[str, Any]) -> list[str]:
    return [f["cause"] for f in doc["findings"]]


# Skips that mean something CI installs is missing (an extra, a tool, Chromium): in CI they fail. A skip for
# what the machine itself cannot do (not root, no unshare, one core) stays a skip, listed by -ra.
MISSING_IN_CI = ("could not import", "not installed", "no Chromium")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """In CI (``CI=true``) a test skipped because a dependency is missing fails instead: CI installs every
    extra, the tools and Chromium (and ``require_shared`` already fails there for ``../shared/data``), so
    such a skip means something it should test was not tested. GPU tests may skip."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("CI", "").lower() == "true"
        and item.get_closest_marker("gpu") is None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(word in reason for word in MISSING_IN_CI):
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, which installs what this test needs: {reason}"


# The slow tier's longest tests (each 1.5-4 min on the quiet 2-core machine, 2026-12-04), started first: on
# two xdist workers the run ends when the later worker does, and a four-minute test picked up last would
# leave the other worker idle that long. Longest first leaves the short tests to fill in at the end.
LONGEST_FIRST = (
    "tests/integration/test_tune.py",
    "tests/integration/test_tune_slow_job.py",
    "tests/integration/test_batch_finder.py",
    "tests/browser/test_reports.py",
    "tests/fuzz/test_fuzz.py",
    "tests/integration/test_public_scripts.py",
    "tests/integration/test_analyze_cli.py",  # four recorded CPU traces analyzed in one test
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FIRST's order), every other test after them in collection order."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together and in their order
