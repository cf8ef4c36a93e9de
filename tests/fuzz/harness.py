"""Fuzzing what pitstop reads offline: seeds, mutators, and the two ways a case runs.

A case is (seed file, mutators) or a special file-system shape (a FIFO, a link to /dev/zero, a link out of a
folder, a checkpoint folder, a sparse 100 MB file, a DeepSpeed path to /etc/passwd). Each is written to a
fresh folder and run either in-process (``load_run`` + ``diagnose`` + the JSON document, each case in a
process forked from a worker that has imported pitstop once) or through the real CLI (``pitstop analyze FILE
--json`` / ``pitstop check FILE`` in a fresh interpreter). Either way the case's own peak RSS comes from
``os.wait4``. What must hold for every case:

* a result (exit 0 and a JSON document without NaN or infinity), or a ``PitstopError`` whose message is one
  line (through the CLI: exit 2, one line on stderr);
* never a traceback, never "internal error", never a hang (a case has ``CASE_GUARD_S`` seconds: a hang
  detector, far above any case's real cost);
* peak memory under ``RSS_BOUND_MB``;
* no control character of the input in what reaches the terminal (the in-process report is rendered too),
  and no MarkupError: the ``hostile_strings`` mutator puts markup and escape sequences in every field;
* ``--json`` of each CLI case names a different kind of path (a file, a link, a dangling link, ``-``, a FIFO,
  a name with markup or escape codes): the document lands where the user pointed and the path keeps its
  kind; ``run_output_inprocess`` adds a device node (as root) and a folder (refused, exit 2).

Cases are a pure function of (seed, index), so a failing case is repeated with ``--only INDEX``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent / "seeds"
CORPUS = ROOT / "tests" / "corpus"
SHARED = Path(os.environ.get("PITSTOP_SHARED_DATA", str(ROOT.parent / "shared" / "data")))
SHARED_FALLBACK = Path("/work/shared/data")

RSS_BOUND_MB = 512  # any one CLI run, and the in-process worker over all its cases
ADDRESS_LIMIT = 2 * 2**30  # a safety net so a blow-up fails as MemoryError instead of hurting the machine


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))


CASE_GUARD_S = 120  # a hang detector, not a speed requirement
MAX_CASE_BYTES = 64 * 2**20  # a mutation never grows an input past this
QUICK_SEED_BYTES = 256 * 1024  # the quick (CI) run mutates only seeds up to this size; the long run all

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
Mutator = Callable[[bytes, random.Random], bytes]
NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
STRING = re.compile(rb'"[^"\n]{1,80}"')
HOSTILE_NUMBERS = [
    b"1e400",
    b"-1e400",
    b"9" * 5000,
    b"9" * 300,
    b"-5",
    b"0",
    b"-1",
    b"1e308",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b".nan",
    b".inf",
    b"4294967296",
    b"0.0000001",
    b'"abc"',
    b"null",
    b"true",
    b"{}",
    b"[]",
]


# --- seeds ----------------------------------------------------------------------------------------------------


def shared_root() -> Path | None:
    for root in (SHARED, SHARED_FALLBACK):
        if root.is_dir():
            return root
    return None


def seeds(quick: bool) -> list[Path]:
    """The repository's seeds and corpus, plus the shared third-party artifacts when present (read there,
    never copied into the repository)."""
    found = sorted(p for p in SEEDS.iterdir() if p.is_file())
    found += sorted(p for p in CORPUS.iterdir() if p.is_file())
    root = shared_root()
    if root is not None:
        for sub in ("nvidia_smi", "trainer_state", "configs", "traces"):
            found += sorted(p for p in (root / sub).rglob("*") if p.is_file() and p.suffix != ".md")
    if quick:
        found = [p for p in found if p.stat().st_size <= QUICK_SEED_BYTES]
    return found


def is_trace(data: bytes) -> bool:
    return b'"traceEvents"' in data[:65536] or b'"schemaVersion"' in data[:65536]


def seed_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError):
            return data  # a truncated gzip of the corpus: mutate it as it is
    return data


# --- mutators -------------------------------------------------------------------------------------------------


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def bit_flips(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.choice((1, 2, 8, 64))):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [data]


def delete_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    for _ in range(rng.choice((1, 3, len(lines) // 2 or 1))):
        if lines:
            del lines[rng.randrange(len(lines))]
    return b"".join(lines)


def duplicate_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    i = rng.randrange(len(lines))
    times = min(rng.choice((2, 10, 1000, 20000)), MAX_CASE_BYTES // max(1, len(lines[i])))
    return b"".join(lines[:i] + [lines[i]] * times + lines[i:])


def _replace_match(data: bytes, rng: random.Random, pattern: re.Pattern[bytes], new: bytes) -> bytes:
    matches = list(pattern.finditer(data[:200_000]))
    if not matches:
        return data + new
    m = rng.choice(matches)
    return data[: m.start()] + new + data[m.end() :]


def hostile_number(data: bytes, rng: random.Random) -> bytes:
    return _replace_match(data, rng, NUMBER, rng.choice(HOSTILE_NUMBERS))


def deep_nesting(data: bytes, rng: random.Random) -> bytes:
    depth = rng.choice((70, 999, 1001, 5000, 100_000))
    opener, closer = rng.choice(((b"[", b"]"), (b'{"a":', b"}")))
    return _replace_match(data, rng, NUMBER, opener * depth + b"1" + closer * depth)


def long_string(data: bytes, rng: random.Random) -> bytes:
    size = rng.choice((10_000, 200_000, 2_000_000))
    text = b'"' + rng.choice((b"x", b"\\u00e9", b"\xc3\xa9", b",")) * size + b'"'
    return _replace_match(data, rng, rng.choice((STRING, NUMBER)), text)


def many_gpus(data: bytes, rng: random.Random) -> bytes:
    """The nvidia-smi log of "400,000 GPUs", smaller: one row for each of thousands of indices."""
    n = rng.choice((5000, 50_000))
    header = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
    return (header + "".join(f"2026/01/03 10:00:00.000, {i}, 50 %, 10 MiB\n" for i in range(n))).encode()


def random_splice(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.randbytes(rng.choice((1, 16, 4096))) + data[i:]


def utf16(data: bytes, rng: random.Random) -> bytes:
    return data.decode("utf-8", errors="replace").encode("utf-16")


# rich markup and terminal control sequences: none may be read as markup or reach the terminal
HOSTILE_TEXT = (
    "[/a]",
    "[red]x[/red]",
    "[link=https://evil.example]y[/link]",
    "[/]",
    "\\[",
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
    "\x1b[2J\x1b[H",
    "\x9b31m",
    "\x07\r\x08",
    "\u202e",
)
GPU_NAME = re.compile(rb"NVIDIA[^,\n]*")
YAML_VALUE = re.compile(rb"^([ \t]*[\w.-]+:[ \t]+)([A-Za-z/][^\n#\"']*?)[ \t]*$", re.M)
PLAIN_WORDS = {b"true", b"false", b"null", b"yes", b"no", b"on", b"off", b"auto"}


def hostile_strings(data: bytes, rng: random.Random) -> bytes:
    """Markup and escape strings in every field: each string value gets one appended (JSON's quoted values
    and YAML's plain ones, written JSON-escaped so the file stays valid and the keys as they were), a CSV's
    GPU names get them raw."""

    def text() -> str:
        return "".join(rng.choice(HOSTILE_TEXT) for _ in range(rng.choice((1, 2, 3))))

    def quoted(m: re.Match[bytes]) -> bytes:
        rest = data[m.end() : m.end() + 40].lstrip()
        if rest.startswith(b":"):  # a key: kept, so the file is still recognized
            return m.group(0)
        return m.group(0)[:-1] + json.dumps(text())[1:-1].encode() + b'"'

    def plain(m: re.Match[bytes]) -> bytes:
        if m.group(2).lower() in PLAIN_WORDS:
            return m.group(0)
        value = m.group(2).decode("utf-8", errors="replace") + text()
        return m.group(1) + json.dumps(value).encode()

    head = data[:2_000_000]
    changed = STRING.sub(quoted, head, count=2000)
    changed = YAML_VALUE.sub(plain, changed, count=2000) + data[2_000_000:]
    if changed == data:
        changed = GPU_NAME.sub(lambda m: m.group(0) + text().encode(), data, count=2000)
    return changed if changed != data else data + json.dumps(text()).encode()


MUTATORS: dict[str, Mutator] = {
    f.__name__: f
    for f in (
        truncate,
        bit_flips,
        delete_lines,
        duplicate_lines,
        hostile_number,
        deep_nesting,
        long_string,
        many_gpus,
        random_splice,
        utf16,
        hostile_strings,
    )
}
WEIGHTS = {"many_gpus": 0.3, "utf16": 0.3, "random_splice": 0.7}

SPECIALS = (
    "fifo",
    "fifo_in_folder",
    "dev_zero_link",
    "dev_zero_in_folder",
    "link_out_of_folder",
    "checkpoint_folder",
    "sparse_100mb",
    "empty_file",
    "proc_file",
    "deepspeed_etc_passwd",
    "deepspeed_fifo",
    "deepspeed_dev_zero",
    "gzip_bomb",
    "truncated_gzip",
    "yaml_alias_bomb",
)


# --- cases ----------------------------------------------------------------------------------------------------


@dataclass
class Case:
    index: int
    seed: str  # the seed file, or "special:<name>"
    mutators: list[str] = field(default_factory=list)
    gzip: bool = False
    check: bool = False  # run as `pitstop check` (configs only)
    trace: bool = False  # the trace reader is involved (reported apart; another module owns it)


@dataclass
class Outcome:
    case: Case
    status: str  # "result", "refused" (one line + exit 2), "FAIL"
    detail: str
    seconds: float
    rss_mb: float  # the in-process worker's peak so far (all cases), or the CLI child's own peak


TRACE_SPECIALS = ("trace_deep_nesting", "trace_gzip_bomb", "trace_long_name")  # the long run only (costly)
CLI_SPECIALS = ("fifo", "dev_zero_link", "checkpoint_folder", "deepspeed_etc_passwd", "gzip_bomb")


def make_case(index: int, seed: int, pool: list[Path], quick: bool = True) -> Case:
    """Case ``index`` of run ``seed``; negative indices are the special shapes every CLI run includes."""
    if index < 0:
        return Case(index=index, seed=f"special:{CLI_SPECIALS[-index - 1]}")
    rng = random.Random(f"{seed}:{index}")
    if rng.random() < 0.12:
        name = rng.choice(SPECIALS + (() if quick else TRACE_SPECIALS))
        return Case(index=index, seed=f"special:{name}", trace=name.startswith("trace_"))
    path = rng.choice(pool)
    names = list(MUTATORS)
    weights = [WEIGHTS.get(n, 1.0) for n in names]
    chosen = rng.choices(names, weights=weights, k=rng.choice((1, 1, 2, 3)))
    data = seed_bytes(path)
    case = Case(index=index, seed=str(path), mutators=chosen, gzip=rng.random() < 0.15, trace=is_trace(data))
    case.check = path.suffix in CONFIG_SUFFIXES and not case.trace and rng.random() < 0.3
    return case


def build(case: Case, folder: Path) -> Path:
    """Write the case's input under ``folder``; the path to give pitstop."""
    if case.seed.startswith("special:"):
        return _special(case.seed.removeprefix("special:"), folder)
    rng = random.Random(f"mutate:{case.index}:{case.seed}")
    data = seed_bytes(Path(case.seed))
    for name in case.mutators:
        data = MUTATORS[name](data, rng)
    name = Path(case.seed).name.removesuffix(".gz")
    if case.gzip:
        data, name = gzip.compress(data, compresslevel=1), name + ".gz"
    path = folder / name
    path.write_bytes(data)
    if name.startswith(("sft_args", "axolotl")):  # the DeepSpeed file they name, beside them
        shutil.copy(SEEDS / "ds_zero3.json", folder / "ds_zero3.json")
    return path


def _trainer_state(path: Path) -> Path:
    shutil.copy(SEEDS / "trainer_state.json", path)
    return path


def _special(name: str, folder: Path) -> Path:
    run = folder / "run"
    run.mkdir()
    if name in ("fifo", "fifo_in_folder"):
        os.mkfifo(run / "pipe.json")
        _trainer_state(run / "trainer_state.json")
        return run / "pipe.json" if name == "fifo" else run
    if name in ("dev_zero_link", "dev_zero_in_folder"):
        (run / "zero.json").symlink_to("/dev/zero")
        _trainer_state(run / "trainer_state.json")
        return run / "zero.json" if name == "dev_zero_link" else run
    if name == "link_out_of_folder":
        (run / "passwd.yaml").symlink_to("/etc/passwd")
        (run / "state.json").symlink_to(_trainer_state(folder / "outside.json"))
        shutil.copy(SEEDS / "sft_args.json", run / "args.json")
        return run
    if name == "checkpoint_folder":
        _trainer_state(run / "trainer_state.json")
        (run / "training_args.bin").write_bytes(b"\x80\x04\x95" + os.urandom(200))
        (run / "optimizer.pt").write_bytes(b"PK\x03\x04" + os.urandom(200))
        (run / "rng_state.pth").write_bytes(b"PK\x03\x04" + os.urandom(50))
        (run / "model.safetensors").write_bytes((64).to_bytes(8, "little") + b"{}" + bytes(200))
        shutil.copy(SEEDS / "config.json", run / "config.json")
        return run
    if name == "sparse_100mb":
        path = run / "big.json"
        with path.open("wb") as f:
            f.write(b'{"output_dir": "')
            f.truncate(100 * 2**20)
        return path
    if name == "empty_file":
        path = run / "empty.yaml"
        path.touch()
        return path
    if name == "proc_file":
        return Path("/proc/self/status")
    if name.startswith("deepspeed_"):
        target = {"deepspeed_etc_passwd": "/etc/passwd", "deepspeed_dev_zero": "/dev/zero"}.get(
            name, "fifo.json"
        )
        if target == "fifo.json":
            os.mkfifo(run / "fifo.json")
        path = run / "axolotl.yaml"
        path.write_text(f"base_model: m\nmicro_batch_size: 2\ndeepspeed: {target}\n")
        return path
    if name == "gzip_bomb":
        path = run / "bomb.yaml.gz"
        with gzip.open(path, "wb", compresslevel=9) as f:
            f.write(b"output_dir: o\nlogging_steps: 1\n")
            for _ in range(100):  # 100 MB of spaces from ~100 KB
                f.write(b" " * 2**20)
        return path
    if name == "truncated_gzip":
        data = gzip.compress((SEEDS / "trace.json").read_bytes())
        path = run / "trace.json.gz"
        path.write_bytes(data[: len(data) // 2])
        return path
    if name == "trace_deep_nesting":  # issue 14: 138 bytes of gzip, 40,000 nested brackets
        path = run / "deep.json.gz"
        path.write_bytes(gzip.compress(b'{"traceEvents": ' + b"[" * 40_000 + b"]" * 40_000 + b"}"))
        return path
    if name == "trace_gzip_bomb":
        path = run / "bomb.json.gz"
        with gzip.open(path, "wb", compresslevel=9) as f:
            f.write(b'{"schemaVersion": 1, "traceEvents": [')
            for _ in range(300):
                f.write(b" " * 2**20)
            f.write(b"]}")
        return path
    if name == "trace_long_name":  # one kernel name of 20 MB
        event = '{"ph": "X", "cat": "kernel", "name": "%s", "ts": 1, "dur": 2, "pid": 0, "tid": 7}' % (
            "k" * 20 * 2**20
        )
        path = run / "long.json.gz"
        path.write_bytes(gzip.compress(('{"schemaVersion": 1, "traceEvents": [' + event + "]}").encode()))
        return path
    if name == "yaml_alias_bomb":
        lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
        for i in range(1, 10):
            lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
        path = run / "bomb.yaml"
        path.write_text("\n".join(lines) + "\noutput_dir: o\nlogging_steps: 1\n")
        return path
    raise ValueError(name)  # pragma: no cover - SPECIALS lists the names above


def _one_line(message: str) -> bool:
    return bool(message.strip()) and "\n" not in message.strip() and "Traceback" not in message


# --- running in-process (the bulk) ----------------------------------------------------------------------------


class _Hung(BaseException):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hung


def run_inprocess(case: Case) -> Outcome:
    """load_run + diagnose + the JSON document, in this process (the test's monkeypatches apply)."""
    from pitstop.diagnose import diagnose
    from pitstop.errors import PitstopError
    from pitstop.ingest.load import Inputs, load_run

    folder = Path(tempfile.mkdtemp(prefix="pitstop-fuzz-"))
    start = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_GUARD_S)
    try:
        path = build(case, folder)
        profile = load_run(Inputs(paths=[path], configs_only=case.check))
        diagnosis = diagnose(profile)
        doc = diagnosis.to_dict()
        json.dumps(doc, allow_nan=False)  # nothing non-finite reaches a result
        leak = terminal_leak(diagnosis)
        status, detail = ("FAIL", leak) if leak else ("result", f"{len(doc.get('findings', []))} findings")
    except PitstopError as exc:
        message = str(exc)
        status, detail = (
            ("refused", message) if _one_line(message) else ("FAIL", f"multi-line error: {message!r}")
        )
    except _Hung:
        status, detail = "FAIL", f"still running after {CASE_GUARD_S} s (a hang?)"
    except Exception as exc:  # the property under test: nothing else may escape
        status, detail = "FAIL", f"{type(exc).__name__}: {exc}"[:300] + "\n" + traceback.format_exc()[-1500:]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        shutil.rmtree(folder, ignore_errors=True)
    return Outcome(case=case, status=status, detail=detail, seconds=time.perf_counter() - start, rss_mb=0.0)


CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_leak(diagnosis: object) -> str | None:
    """The terminal report of ``diagnosis`` as rich would print it (to a file: no escape codes of rich's own),
    and what of the input leaked into it: a control character, or a MarkupError (raised, so a FAIL)."""
    import io

    from rich.console import Console

    from pitstop.report.terminal import render

    out = io.StringIO()
    render(diagnosis, Console(file=out, width=120))  # type: ignore[arg-type]
    found = CONTROL.search(out.getvalue())
    return None if found is None else f"control character {found.group(0)!r} reached the terminal report"


def run_forked(case: Case) -> Outcome:
    """run_inprocess in a forked child of the worker: the case's own peak RSS comes from os.wait4 (the child
    starts from the worker's pages, all imports done, so there is no interpreter start per case), and a case
    that dies (the address-space limit, a signal) cannot take the other cases with it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        code = 0
        try:
            outcome = run_inprocess(case)
            with os.fdopen(write_end, "w") as f:
                json.dump(asdict(outcome), f)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        raw = f.read()
    _, status, usage = os.wait4(pid, 0)
    rss = usage.ru_maxrss / 1024
    if not raw:
        code = os.waitstatus_to_exitcode(status)
        why = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        return Outcome(
            case=case, status="FAIL", detail=f"the case's process died ({why})", seconds=0.0, rss_mb=rss
        )
    outcome = Outcome(**{**json.loads(raw), "case": case})
    outcome.rss_mb = rss
    return outcome


# --- running through the CLI (a subset) -----------------------------------------------------------------------


SPAWNER = r"""
import json, os, resource, subprocess, sys, time
cmd, cwd, out, err, limit, guard = json.loads(sys.argv[1])
def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
with open(out, "wb") as so, open(err, "wb") as se:
    proc = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=cwd, preexec_fn=limit_memory)
    deadline, timed_out = time.monotonic() + guard, False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            timed_out = True
            break
        time.sleep(0.02)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss, "timed_out": timed_out}))
"""


def _spawn_measured(cmd: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path) -> dict[str, Any]:
    """Run ``cmd`` under the address-space limit and the hang guard, from a slim interpreter that only
    spawns and waits: a child forked from this (large) test process starts with this process's resident
    pages counted, and Linux keeps that count as the child's peak across exec, so os.wait4 here would report
    the test process's size, not the case's (655 MiB for every case once other tests had grown it)."""
    spec = json.dumps([cmd, str(cwd), str(out), str(err), ADDRESS_LIMIT, CASE_GUARD_S])
    done = subprocess.run(
        [sys.executable, "-S", "-c", SPAWNER, spec], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_cli(case: Case) -> Outcome:
    """``pitstop analyze FILE --json out.json`` (or ``pitstop check FILE``) in a fresh interpreter; its peak
    RSS from os.wait4 in a slim spawner (``_spawn_measured``), which reports the one child's own usage."""
    folder = Path(tempfile.mkdtemp(prefix="pitstop-fuzz-cli-"))
    (folder / "output").mkdir()
    start = time.perf_counter()
    try:
        path = build(case, folder)
        target = output_target(CLI_OUTPUT_SHAPES[case.index % len(CLI_OUTPUT_SHAPES)], folder / "output")
        assert target is not None  # every CLI shape can be made anywhere
        args = (
            ["check", str(path)]
            if case.check
            else ["analyze", str(path), "--json", target.arg, "--no-history"]
        )
        env = {**os.environ, "COLUMNS": "120", "PITSTOP_HISTORY": str(folder / "history.sqlite3")}
        env.pop("PITSTOP_DEBUG", None)
        spawned = _spawn_measured(
            [sys.executable, "-m", "pitstop", *args],
            env,
            folder / "output",
            folder / "stdout",
            folder / "stderr",
        )
        timed_out = spawned["timed_out"]
        stderr = (folder / "stderr").read_text(errors="replace").strip()
        stdout = (folder / "stdout").read_bytes()
        rc, rss = spawned["rc"], spawned["maxrss_kib"] / 1024
        printed = (stderr + stdout.decode(errors="replace")) if target.shape != "stdout" else stderr
        leak = CONTROL.search(printed)
        problem = None if case.check else output_problem(target, rc, stdout, stderr)
        if timed_out:
            result, detail = "FAIL", f"still running after {CASE_GUARD_S} s (a hang?)"
        elif leak is not None:
            result, detail = (
                "FAIL",
                f"control character {leak.group(0)!r} from the input reached the terminal",
            )
        elif problem is not None:
            result, detail = "FAIL", f"--json {target.shape}: {problem}"
        elif rc == 0:
            result, detail = "result", "exit 0"
        elif rc == 2 and _one_line(stderr):
            result, detail = "refused", stderr
        else:
            result, detail = "FAIL", f"exit {rc}: {stderr[-1500:]}"
        return Outcome(
            case=case, status=result, detail=detail, seconds=time.perf_counter() - start, rss_mb=rss
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} in the document")


# --- output paths -----------------------------------------------------------------------------------------------

# what --json may name: each must end with the document where the user pointed, the path's kind unchanged
CLI_OUTPUT_SHAPES = ("file", "symlink", "stdout", "fifo", "markup_name", "escape_name", "dangling_symlink")
OUTPUT_SHAPES = (*CLI_OUTPUT_SHAPES, "device", "folder")  # in-process only: a device needs root, a folder
# is refused before the input is read (it would hide the input's own outcome)


@dataclass
class OutputTarget:
    """One ``--json`` target made in ``folder``, and what must hold of it after the run."""

    shape: str
    folder: Path
    arg: str = ""
    got: list[bytes] = field(default_factory=list)
    reader: threading.Thread | None = None
    rdev: int = 0

    def document(self, stdout: bytes) -> bytes | None:
        """Where the document should have gone, read back (None: nothing there)."""
        if self.shape == "stdout":
            return stdout
        if self.shape == "fifo":
            self.finish()
            return self.got[0] if self.got else None
        where = Path(os.path.realpath(self.arg))
        return where.read_bytes() if where.is_file() else None

    def finish(self) -> None:
        """A FIFO's reader gets its end of file even when pitstop never opened the FIFO."""
        if self.reader is not None and self.reader.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(self.arg, os.O_WRONLY | os.O_NONBLOCK))
            self.reader.join(10)

    def damage(self) -> str | None:
        """What about the path itself changed that must not have."""
        path = Path(self.arg)
        if self.shape in ("symlink", "dangling_symlink") and not path.is_symlink():
            return "the link was replaced by a file"
        if self.shape == "fifo" and not stat.S_ISFIFO(path.lstat().st_mode):
            return "the FIFO was replaced"
        if self.shape == "device":
            info = path.lstat()
            if not stat.S_ISCHR(info.st_mode) or info.st_rdev != self.rdev:
                return "the device node was replaced"
        if self.shape == "stdout" and (self.folder / "-").exists():
            return "a file named '-' was written"
        leftovers = [p.name for p in self.folder.rglob(".*.tmp")]
        return f"temporary files left: {leftovers}" if leftovers else None


def output_target(shape: str, folder: Path) -> OutputTarget | None:
    """The target of ``shape`` in ``folder``; None where it cannot be made here (a device node without root,
    or where such a node cannot be opened)."""
    t = OutputTarget(shape, folder, str(folder / "out.json"))
    if shape in ("symlink", "dangling_symlink"):
        (folder / "real").mkdir()
        real = folder / "real" / "out.json"
        if shape == "symlink":
            real.write_text("old")
        t.arg = str(folder / "link.json")
        Path(t.arg).symlink_to(real)
    elif shape == "markup_name":
        (folder / "[").mkdir()
        t.arg = str(folder / "[" / "y][red]x.json")
    elif shape == "escape_name":
        t.arg = str(folder / "out\x1b[2J\x1b]8;;x\x07.json")
    elif shape == "stdout":
        t.arg = "-"
    elif shape == "fifo":
        os.mkfifo(t.arg)
        t.reader = threading.Thread(target=lambda: t.got.append(Path(t.arg).read_bytes()), daemon=True)
        t.reader.start()
    elif shape == "device":
        if os.geteuid() != 0:
            return None
        t.rdev = os.makedev(1, 3)  # the null device's numbers; the node lives in the case's folder
        os.mknod(t.arg, 0o666 | stat.S_IFCHR, t.rdev)
        try:
            os.close(os.open(t.arg, os.O_WRONLY))
        except OSError:
            return None
    elif shape == "folder":
        os.mkdir(t.arg)
    return t


def output_problem(t: OutputTarget, rc: int, stdout: bytes, stderr: str) -> str | None:
    """Why the run broke the output property, or None: a folder refused with exit 2 in one line; else the
    path's kind unchanged and, after exit 0, a valid document where the user pointed."""
    t.finish()
    if t.shape == "folder":
        return None if rc == 2 and _one_line(stderr) and "is a folder" in stderr else f"a folder: exit {rc}"
    damage = t.damage()
    if damage:
        return damage
    if rc != 0 or t.shape == "device":
        return None
    doc = t.document(stdout)
    try:
        json.loads(doc or b"", parse_constant=_no_constant)
    except ValueError as exc:
        return f"--json {t.shape}: no valid document where it points ({exc})"
    return None


def run_output_inprocess(shape: str, seed: Path = SEEDS / "smi_header.csv") -> str | None:
    """``pitstop analyze SEED --json <shape>`` through the CLI's ``main()`` in this process; the problem, or
    None (also None when the shape cannot be made here)."""
    import contextlib
    import io

    from pitstop.cli.app import main

    folder = Path(tempfile.mkdtemp(prefix="pitstop-fuzz-out-"))
    try:
        target = output_target(shape, folder)
        if target is None:
            return None
        out, err = io.StringIO(), io.StringIO()
        argv, sys.argv = sys.argv, ["pitstop", "analyze", str(seed), "--json", target.arg, "--no-history"]
        rc = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main()
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.argv = argv
        return output_problem(target, rc, out.getvalue().encode(), err.getvalue())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- a run ------------------------------------------------------------------------------------------------------


@dataclass
class Summary:
    cases: int
    cli_cases: int
    failures: list[Outcome]
    trace_failures: list[Outcome]
    worst_seconds: float
    worst_seconds_case: str
    worst_rss_mb: float  # the worst one case's process
    worst_rss_case: str
    statuses: dict[str, int]
    outside_trace: str = ""  # the same two figures over the cases the trace reader is not part of

    def lines(self) -> list[str]:
        out = [
            f"cases run: {self.cases} ({self.cases - self.cli_cases} in-process, {self.cli_cases} through the CLI)",
            f"outcomes: {self.statuses}",
            f"worst time: {self.worst_seconds:.2f} s ({self.worst_seconds_case})",
            f"worst peak RSS: {self.worst_rss_mb:.0f} MiB ({self.worst_rss_case}); bound {RSS_BOUND_MB} MiB",
            f"without the trace reader: {self.outside_trace}",
        ]
        for label, group in (("FAILED", self.failures), ("FAILED (trace reader)", self.trace_failures)):
            for o in group:
                out.append(
                    f"{label} case {o.case.index} {describe(o.case)}: {o.detail.splitlines()[0][:300]}"
                )
        return out


def describe(case: Case) -> str:
    name = case.seed.removeprefix(str(ROOT) + "/")
    how = "check" if case.check else "analyze"
    return f"[{how} {name} {'+'.join(case.mutators)}{' gz' if case.gzip else ''}]"


def summarize(inprocess: list[Outcome], cli: list[Outcome]) -> Summary:
    """Figures and failures; every case's memory is its own process's peak RSS."""
    outcomes = inprocess + cli
    for o in outcomes:
        if o.rss_mb > RSS_BOUND_MB and o.status != "FAIL":
            o.status, o.detail = "FAIL", f"peak RSS {o.rss_mb:.0f} MiB over the bound of {RSS_BOUND_MB} MiB"
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    bad = [o for o in outcomes if o.status == "FAIL"]
    slowest = max(outcomes, key=lambda o: o.seconds)
    heaviest = max(outcomes, key=lambda o: o.rss_mb)
    plain = [o for o in outcomes if not o.case.trace] or outcomes
    slow, big = max(plain, key=lambda o: o.seconds), max(plain, key=lambda o: o.rss_mb)
    outside = (
        f"worst time {slow.seconds:.2f} s (case {slow.case.index} {describe(slow.case)}), "
        f"worst peak RSS {big.rss_mb:.0f} MiB (case {big.case.index} {describe(big.case)})"
    )
    return Summary(
        cases=len(outcomes),
        cli_cases=len(cli),
        failures=[o for o in bad if not o.case.trace],
        trace_failures=[o for o in bad if o.case.trace],
        worst_seconds=slowest.seconds,
        worst_seconds_case=f"case {slowest.case.index} {describe(slowest.case)}",
        worst_rss_mb=heaviest.rss_mb,
        worst_rss_case=f"case {heaviest.case.index} {describe(heaviest.case)}",
        statuses=statuses,
        outside_trace=outside,
    )


def worker_main(cases: int, seed: int, quick: bool, only: int | None, out: Path) -> None:
    """The in-process bulk, in its own process so that its peak RSS is its own."""
    pool = seeds(quick)
    indices = [only] if only is not None else list(range(cases))
    results = []
    for n, i in enumerate(indices, 1):
        results.append(run_forked(make_case(i, seed, pool, quick)))
        if n % 100 == 0:
            print(f"fuzz: {n}/{len(indices)} in-process cases", file=sys.stderr, flush=True)
    out.write_text(json.dumps([asdict(o) for o in results]))


def run_worker(cases: int, seed: int, quick: bool, only: int | None = None) -> list[Outcome]:
    """Run the in-process bulk in a fresh worker (a small, clean parent to fork each case from)."""
    with tempfile.TemporaryDirectory(prefix="pitstop-fuzz-worker-") as tmp:
        out = Path(tmp) / "outcomes.json"
        args = [sys.executable, "-m", "tests.fuzz", "--worker", "--cases", str(cases), "--seed", str(seed)]
        args += ["--quick"] if quick else []
        args += ["--only", str(only)] if only is not None else []
        proc = subprocess.Popen([*args, "--out", str(out)], cwd=ROOT, preexec_fn=_limit_memory)
        _, status, _ = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not out.is_file():
            raise RuntimeError(f"the fuzz worker died (exit {os.waitstatus_to_exitcode(status)})")
        raw = json.loads(out.read_text())
    return [Outcome(**{**o, "case": Case(**o["case"])}) for o in raw]


def run(cases: int, seed: int, quick: bool, cli_cases: int, only: int | None = None) -> Summary:
    """``cases`` in-process cases, then through the CLI the CLI_SPECIALS and ``cli_cases`` cases of their own
    (the indices after the in-process ones).
    With ``only``, that one case in-process (the CLI cases are repeated with ``--cli-only INDEX``)."""
    inprocess = run_worker(cases, seed, quick, only)
    pool = seeds(quick)
    indices = [-k - 1 for k in range(len(CLI_SPECIALS))] + list(range(cases, cases + cli_cases))
    cli = [run_cli(make_case(i, seed, pool, quick)) for i in indices] if only is None else []
    return summarize(inprocess, cli)
