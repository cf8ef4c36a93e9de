"""A training run's log (its stdout / stderr as saved: ``pitstop analyze train.log``): the lines the libraries
print when a setting that slows every step is on, read into the facts the rules read.

* DDP's own warning, printed once by each process whose unused-parameter search found none unused (the
  reducer's TORCH_WARN_ONCE): ``find_unused_parameters=True was specified in DDP constructor, but did not find
  any unused parameters in the forward pass``. It proves the search ran and, in that step, every parameter got
  a gradient: ``RankProfile.ddp`` says so, and the run's ``ddp_find_unused_parameters`` is True.
* torch.compile (dynamo, any version): the recompile limit reached, ``torch._dynamo hit
  config.recompile_limit (8)`` (``cache_size_limit`` before 2.6) with its function and last reason; with
  ``TORCH_LOGS=recompiles`` every ``Recompiling function ...`` and its guard failures; with
  ``TORCH_LOGS=graph_breaks`` each ``Graph break in user code``. Into ``RankProfile.compile``.
* autograd's anomaly detection: ``detect_anomaly()``'s warning ``Anomaly Detection has been enabled``,
  Lightning's ``You have turned on `Trainer(detect_anomaly=True)` ``, and the error report only anomaly mode
  writes, ``Traceback of forward call that caused the error``. Into the run's ``anomaly_detection``.
* NCCL's own init lines (``NCCL_DEBUG=INFO``: the network it opened, each channel's transport; ``nccl_log.py``).
  Into the run's ``links``.

A line's process is its launcher prefix (torchrun's ``[rank1]:``, older ``[default1]:``), else the first
process. The log is streamed in chunks, at most ``LOG_LIMIT`` bytes, each line cut at ``LINE_LIMIT``: a log of
any size costs bounded memory and time, and what was not read is said. A whole-run log is not a measured
window: what it proves is a setting and its counters over the run, not their share of a step."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.artifacts import IngestError, open_binary
from pitstop.core.profile import CompileStats, DdpSettings, Environment
from pitstop.ingest.nccl_log import NCCL_WORDS, NcclReader

LOG_LIMIT = 2**30  # bytes of a log read; a longer one is read to here and the rest said to be unread
LINE_LIMIT = 8192  # a line longer than this is cut (a progress bar rewritten with \r, a dumped tensor)
CHUNK = 2**20
MAX_RANKS = 65_536  # a rank prefix beyond any job is not a rank
MAX_REASONS = 5  # the commonest guard failures kept

RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d{1,6})\]:\s?")
# torch's own log header (glog style): "W1206 07:11:56.172000 26229 torch/_dynamo/convert_frame.py:1994] "
# (in 2.0-2.1 "[2023-10-01 12:00:00,000] torch._dynamo...: [WARNING] "), then a compile id "[0/8] " and an
# artifact tag "[__recompiles] "
TORCH_HEADER = re.compile(r"^\[?[IWEVDF]\d{4} [\d:.]+ +\d+ [^\]]*\] ")
OLD_HEADER = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] [\w.]+: \[\w+\] ")
COMPILE_ID = re.compile(r"^\[(\d{1,6})/(\d{1,6})(?:_\d+)?\] ")
TAG = re.compile(r"^\[__\w+\] ")

DDP_WARNING = "find_unused_parameters=True was specified in DDP constructor, but did not find any unused"
LIMIT = re.compile(r"torch\._dynamo hit config\.(\w+) \((\d{1,9})\)")
LIMIT_FUNCTION = re.compile(r"^\s*function: (.+)")  # (each group is stripped: no backtracking on a long line)
LIMIT_REASON = re.compile(r"^\s*last reason: (?:\d+/\d+: )?(.+)")
RECOMPILING = re.compile(r"Recompiling function (\S+) in (\S+)")
GUARD_FAILURES = "triggered by the following guard failure(s)"
GUARD_FAILURE = re.compile(r"^\s*- (?:\d+/\d+: )?(.+)")
GRAPH_BREAK = re.compile(r"\[__graph_breaks\] Graph break(?: in user code| from user code|:)")
ANOMALY = (
    "Anomaly Detection has been enabled",  # torch.autograd.detect_anomaly()'s warning
    "You have turned on `Trainer(detect_anomaly=True)`",  # Lightning's
    "Traceback of forward call that caused the error",  # an error report only anomaly mode writes
)
# the words any of the above needs, to skip most lines with one cheap test
WORDS = ("find_unused_parameters", "torch._dynamo", "Recompiling", "guard failure", "- ", "function:",
         "last reason", "[__graph_breaks]", "nomaly", "Traceback of forward")  # fmt: skip

# signs of a log (not a config) in a file's first bytes: torch's header, a launcher's rank prefix, Python's
# logging and warnings, the Trainer's logged dicts, a progress bar, a traceback
LOG_SIGNS = re.compile(
    r"^(?:\[(?:rank|default)\d+\]:|\[?[IWEVDF]\d{4} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"
    r"|(?:INFO|WARNING|ERROR|DEBUG)[: ]|\{'(?:loss|train_runtime|eval_loss|learning_rate|grad_norm)'"
    r"|Traceback \(most recent call last\)|Epoch \d+)"
    r"|(?:UserWarning|FutureWarning|DeprecationWarning): |(?<!\d)\d{1,9}/\d{1,9} \[\d{1,4}:\d\d<|it/s\]|s/it\]",
    re.MULTILINE,
)
MIN_SIGNS = 3  # lines with a sign, in the head, for a file with none of the libraries' own lines


def looks_like_log(text: str) -> bool:
    """A training log, from its content: one of the lines read here, or several lines shaped like a log's."""
    if any(marker in text for marker in (DDP_WARNING, "torch._dynamo hit config.", *ANOMALY)):
        return True
    if RECOMPILING.search(text) or GRAPH_BREAK.search(text):
        return True
    return sum(1 for _ in zip(range(MIN_SIGNS), LOG_SIGNS.finditer(text), strict=False)) >= MIN_SIGNS


@dataclass
class _RankLog:
    """What one process's lines said, and which continuation line a multi-line message waits for."""

    ddp_warned: bool = False
    recompiles: int = 0
    frames: set[int] = field(default_factory=set)  # compile ids' frame numbers seen
    reasons: Counter[str] = field(default_factory=Counter)
    graph_breaks: int = 0
    limit_type: str | None = None
    limit: int | None = None
    limit_frame: str | None = None
    limit_reason: str | None = None
    expect: str | None = None  # "limit" (function / last reason follow), "guard" (the first failure follows)
    expect_left: int = 0

    def compile_stats(self) -> CompileStats | None:
        if not (self.recompiles or self.limit is not None or self.graph_breaks):
            return None
        reasons = Counter(self.reasons)
        if self.limit_reason and not reasons:
            reasons[_reason_kind(self.limit_reason)] += 1
        # a frame that hit the limit was compiled `limit` times: its first compile and limit - 1 recompiles
        recompiles = max(self.recompiles, (self.limit or 1) - 1)
        return CompileStats(
            compiled_frames=recompiles + max(len(self.frames), 1 if recompiles else 0),
            recompiles=recompiles,
            graph_breaks=self.graph_breaks,
            cache_limit_hit=self.limit is not None,
            reasons=[reason for reason, _ in reasons.most_common(MAX_REASONS)],
            recompile_limit=self.limit,
            limit_frame=self.limit_frame,
        )


@dataclass
class LogFacts:
    """A log's facts: the run's (``env``) and each process's (by rank), with what to note."""

    env: Environment
    ddp: dict[int, DdpSettings] = field(default_factory=dict)
    compile: dict[int, CompileStats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lines: int = 0
    processes: int | None = None  # the launcher's rank prefixes seen: "[rank7]:" means 8 processes at least

    @property
    def ranks(self) -> list[int]:
        return sorted({*self.ddp, *self.compile})


def _reason_kind(reason: str) -> str:
    """A guard failure without the values that change with each batch: "tensor 'x' size mismatch at index
    1. expected 40, actual 48" -> "tensor 'x' size mismatch at index 1", so one cause counts as one."""
    cut = reason[:300]  # bounded before any pattern runs over it
    at = cut.find("expected ")
    return (cut[:at].rstrip(" .") if at > 0 else cut).strip()[:200]


def _lines(path: Path, notes: list[str]) -> Iterator[str]:
    """The file's lines (``\\n`` or ``\\r`` ended), each cut at LINE_LIMIT, up to LOG_LIMIT bytes."""
    read = 0
    rest = b""
    with open_binary(path) as f:
        while read < LOG_LIMIT:
            try:
                chunk = f.read(min(CHUNK, LOG_LIMIT - read))
            except (EOFError, OSError, zlib.error):
                notes.append(f"{path.name}: the log ends in a truncated or corrupt gzip; read up to there")
                break
            if not chunk:
                break
            read += len(chunk)
            parts = (rest + chunk).replace(b"\r", b"\n").split(b"\n")
            rest = parts.pop()
            if len(rest) > LINE_LIMIT:
                rest = rest[:LINE_LIMIT]  # a line without end: keep its start, drop the rest of it
            for part in parts:
                yield part[:LINE_LIMIT].decode("utf-8", errors="replace")
        else:
            more = f.read(1)
            if more:
                notes.append(
                    f"{path.name}: only its first {LOG_LIMIT // 2**30} GiB were read (a setting's lines "
                    "printed later are not seen)"
                )
    if rest:
        yield rest.decode("utf-8", errors="replace")


def _body(line: str) -> tuple[int, str, int | None]:
    """(rank, the message without the launcher's prefix and torch's header, the compile id's frame)."""
    rank = 0
    prefix = RANK_PREFIX.match(line)
    if prefix:
        line = line[prefix.end() :]
        rank = int(prefix.group(1)) if int(prefix.group(1)) < MAX_RANKS else 0  # beyond any job: not a rank
    header = TORCH_HEADER.match(line) or OLD_HEADER.match(line)
    if header:
        line = line[header.end() :]
    frame = None
    compile_id = COMPILE_ID.match(line)
    if compile_id:
        frame = int(compile_id.group(1))
        line = line[compile_id.end() :]
    tag = TAG.match(line)
    if tag:
        line = line[tag.end() :]
    return rank, line, frame


def _continuation(state: _RankLog, body: str) -> None:
    """The line after a multi-line message's first: the limit's function and last reason, a recompile's
    first (newest) guard failure."""
    state.expect_left -= 1
    if state.expect == "limit":
        function, reason = LIMIT_FUNCTION.match(body), LIMIT_REASON.match(body)
        if function:
            state.limit_frame = function.group(1).strip()[:300]
        elif reason:
            state.limit_reason = reason.group(1).strip()[:300]
            state.expect = None
    elif state.expect == "guard":
        failure = GUARD_FAILURE.match(body)
        if failure:
            state.reasons[_reason_kind(failure.group(1).strip())] += 1
            state.expect = None
    if state.expect_left <= 0:
        state.expect = None


def _read(state: _RankLog, body: str, frame: int | None, env: Environment) -> None:
    if frame is not None and len(state.frames) < MAX_RANKS:
        state.frames.add(frame)
    if state.expect is not None:
        _continuation(state, body)
    if DDP_WARNING in body:
        state.ddp_warned = True
        return
    limit = LIMIT.search(body)
    if limit:
        state.limit_type, state.limit = limit.group(1), int(limit.group(2))
        state.expect, state.expect_left = "limit", 3
        return
    if RECOMPILING.search(body):
        state.recompiles += 1
        return
    if GUARD_FAILURES in body:
        state.expect, state.expect_left = "guard", 1
        return
    if GRAPH_BREAK.search(body):
        state.graph_breaks += 1
        return
    if any(marker in body for marker in ANOMALY):
        env.anomaly_detection = True
        if "anomaly_detection" not in env.configured_by:
            said = next(m for m in ANOMALY if m in body)
            env.configured_by["anomaly_detection"] = f"the log: {said!r}"


def read_log(path: Path) -> LogFacts:
    """The facts a log states; IngestError only when it cannot be opened."""
    facts = LogFacts(env=Environment())
    facts.env.config_sources.append(str(path))
    states: dict[int, _RankLog] = {}
    nccl = NcclReader()
    try:
        highest = -1
        for line in _lines(path, facts.notes):
            facts.lines += 1
            if line.startswith(("[rank", "[default")):
                prefix = RANK_PREFIX.match(line)
                if prefix and int(prefix.group(1)) < MAX_RANKS:
                    highest = max(highest, int(prefix.group(1)))
            if "NCCL" in line and any(word in line for word in NCCL_WORDS):
                nccl.feed(line)
                continue
            if not any(word in line for word in WORDS):
                continue
            rank, body, frame = _body(line)
            state = states.get(rank)
            if state is None:
                if len(states) >= MAX_RANKS:
                    continue
                state = states[rank] = _RankLog()
            _read(state, body, frame, facts.env)
    except OSError as exc:
        raise IngestError(f"{path}: cannot read ({exc.strerror or exc})") from None
    facts.processes = highest + 1 if highest >= 0 else None
    facts.env.links = nccl.topology()
    for rank, state in sorted(states.items()):
        if state.ddp_warned:
            facts.ddp[rank] = DdpSettings(
                find_unused_parameters=True, unused_parameters=0, set_by="DDP's own warning in the log"
            )
        stats = state.compile_stats()
        if stats is not None:
            facts.compile[rank] = stats
    if facts.ddp:
        facts.env.ddp_find_unused_parameters = True
        shown = ", ".join(map(str, sorted(facts.ddp)))
        facts.env.configured_by["ddp_find_unused_parameters"] = (
            f"{path.name}: DDP's warning 'find_unused_parameters=True was specified in DDP constructor, but did "
            f"not find any unused parameters' (rank {shown})"
        )
    for rank, stats in facts.compile.items():
        if stats.cache_limit_hit:
            facts.notes.append(
                f"{path.name}: rank {rank}: torch._dynamo hit config.{states[rank].limit_type} "
                f"({stats.recompile_limit})"
                + (f" for {stats.limit_frame}" if stats.limit_frame else "")
                + ": that frame runs without compiling from there on"
            )
    return facts
