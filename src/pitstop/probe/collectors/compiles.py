"""torch.compile at work in the training loop: the frames it compiled and recompiled in the measured window,
the seconds that took and the steps it happened in, why each recompile came (the guard that failed), a frame
that reached the recompile limit (it runs eagerly from then on), the graph breaks found, and the ``dynamic=``
the job passed with the job's line that called ``torch.compile``.

Where it is read: every compile torch._dynamo finishes (a first compile, a recompile, the backward's lazy
compile, an attempt stopped by the recompile limit) appends one ``CompilationMetrics`` record to
``torch._dynamo.utils``' bounded deque, with its compile id ("0/3": frame 0, its 4th entry), its cache size
(0: a first compile), the recompile's reason, its duration and, for a limit hit, the failure. At each step's
end the collector reads the records appended since the last one it saw (one identity test when there are
none: no per-step cost beyond it), so a step that compiled is known, and a limit hit from the job's first
compile on (the deque holds the last 64). Graph breaks are ``counters["graph_break"]``, the job's whole count
at the window's end (a break is found when its frame compiles, mostly before the window). ``torch.compile`` (which ``nn.Module.compile`` calls too) is wrapped from the probe's
installation on to note its ``dynamic=`` and the line that called it, handing every call on unchanged.

Nothing is imported or read while the job has not compiled anything: ``RankProfile.compile`` stays None.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter
from typing import Any

from pitstop.core.profile import CompileStats, RankProfile, StepRecord
from pitstop.frames import job_line
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

LIBRARY_PARTS = (
    f"{os.sep}site-packages{os.sep}",
    f"{os.sep}dist-packages{os.sep}",
    f"{os.sep}lib{os.sep}python",
)
LIMIT = re.compile(r"recompile.limit|cache.size.limit|recompile_limit|cache_size_limit", re.IGNORECASE)
COMPILE_ID = re.compile(r"^\s*\[?(\d+)/\d+\]?:?\s*")  # "0/7: " before a guard failure's text
EXPECTED = re.compile(r"\.?\s*expected [^,]+, actual \S+$")  # the values: every recompile's differ
REASONS_KEPT = 3
CALLS_KEPT = 64  # torch.compile calls noted


def reason_of(text: str) -> list[str]:
    """A recompile's guard failures without their compile ids and values, so the same failure on every new
    length reads as one ("tensor 'kwargs['input_ids']' size mismatch at index 1")."""
    first = text.split("\n", 1)[0]
    out = []
    for part in first.split(";"):
        part = EXPECTED.sub("", COMPILE_ID.sub("", part.strip())).strip()
        if part:
            out.append(part)
    return out


def _frame_of(compile_id: Any) -> str | None:
    """The frame's number in a compile id ("0/3" -> "0"; a compiled autograd id "!0/0/3" kept whole)."""
    text = str(compile_id or "")
    return text.rsplit("/", 1)[0] if "/" in text else None


def _entries() -> Any:
    """torch._dynamo's deque of compilation records (rebound by set_compilation_metrics_limit: read anew),
    or None when dynamo was never loaded (nothing compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    found = getattr(utils, "_compilation_metrics", None)
    if found is None and hasattr(utils, "get_compilation_metrics"):
        found = utils.get_compilation_metrics()
    return found


def _graph_breaks() -> int:
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return int(sum(counters.get("graph_break", {}).values()))


def _recompile_limit() -> int | None:
    config = sys.modules.get("torch._dynamo.config")
    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


@collector
class CompileCollector(Collector):
    """The counters are ``CompileStats`` (the profile's own dataclass), fresh at every window start; what is
    known of the whole job (the calls to torch.compile, a limit hit, the frames' names) is kept across."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.stats = CompileStats()
        self.calls: list[tuple[bool | None, str | None]] = []  # each torch.compile call: (dynamic=, line)
        self.seen = 0  # compile records read, from the probe's start
        self.before = 0  # of those, first compiles and recompiles read before the window
        self.limit_hit = False
        self.limit_frame: str | None = None
        self.frames: dict[str, str] = {}  # frame number -> "'forward' (modeling_llama.py:400)"
        self.all_reasons: Counter[str] = Counter()  # from the probe's start: why frames recompiled
        self.window_reasons: Counter[str] = Counter()
        self._last: Any = None  # the last record read
        self._counting = False

    def install(self) -> None:
        import torch

        def make(original: Any) -> Any:
            def compile(*args: Any, **kwargs: Any) -> Any:  # torch's own name: the wrapper reads as it
                if self.ctx.hooks.active:
                    self._note_call(kwargs.get("dynamic"))
                return original(*args, **kwargs)

            return compile

        self.ctx.hooks.patch(torch, "compile", make)

    def _note_call(self, dynamic: Any) -> None:
        if len(self.calls) >= CALLS_KEPT:  # a job that calls torch.compile every step: the first calls say it
            return
        with contextlib.suppress(Exception):  # a note lost; the job's call goes on
            self.calls.append(
                (
                    dynamic if isinstance(dynamic, bool) else None,
                    job_line(sys._getframe(1), skip_parts=LIBRARY_PARTS, skip_prefixes=("<",)),
                )
            )

    # -- reading dynamo's records ----------------------------------------------------------------------
    def _read(self) -> tuple[int, float, bool]:
        """Read the records appended since the last read: the frames compiled among them, their seconds,
        and whether any was compiling work (not only an attempt the recompile limit stopped)."""
        entries = _entries()
        if not entries or entries[-1] is self._last:
            return 0, 0.0, False
        new = []
        for entry in reversed(entries):
            if entry is self._last:
                break
            new.append(entry)
        self._last = entries[-1]
        compiled, seconds, worked = 0, 0.0, False
        for entry in reversed(new):
            self.seen += 1
            frames, spent, work = self._one(entry)
            compiled += frames
            seconds += spent
            worked = worked or work
        return compiled, seconds, worked

    def _one(self, m: Any) -> tuple[int, float, bool]:
        """One record: (1 when it compiled a frame, its seconds, whether it was compiling work)."""
        duration = getattr(m, "duration_us", None)
        seconds = duration / 1e6 if isinstance(duration, int | float) else 0.0
        if not seconds:
            seconds = float(getattr(m, "entire_frame_compile_time_s", None) or 0.0)
        frame = _frame_of(getattr(m, "compile_id", None))
        name = getattr(m, "co_name", None)
        if frame is not None and name:
            filename = os.path.basename(str(getattr(m, "co_filename", "") or ""))
            self.frames[frame] = f"'{name}' ({filename}:{getattr(m, 'co_firstlineno', '?')})"
        fail = str(getattr(m, "fail_reason", None) or "")
        if fail and LIMIT.search(fail):
            self.limit_hit = True
            self.limit_frame = self.frames.get(frame or "", self.limit_frame)
            return 0, seconds, False
        if getattr(m, "is_forward", None) is False or fail:  # the backward's lazy compile; a failed attempt
            return 0, seconds, True
        cache_size = getattr(m, "cache_size", None)
        if isinstance(cache_size, int) and cache_size > 0:
            reasons = reason_of(str(getattr(m, "recompile_reason", None) or "")) or ["(no reason given)"]
            self.all_reasons.update(reasons)
            if self._counting:
                self.stats.recompiles += 1
                self.window_reasons.update(reasons)
        return 1, seconds, True

    # -- the probe's calls ------------------------------------------------------------------------------
    def begin(self) -> None:
        self.before += self._read()[0]  # compiled before the first optimizer step: the first forward

    def start_window(self) -> None:
        self.before += self._read()[0]  # a step's end read them all: nothing new, as a rule
        self.stats = CompileStats()
        self.window_reasons = Counter()
        self._counting = True

    def step_end(self, record: StepRecord) -> None:
        compiled, seconds, worked = self._read()
        if not self._counting:
            self.before += compiled
            return
        self.stats.compiled_frames += compiled
        self.stats.compile_s += seconds
        if worked:
            self.stats.steps_compiling += 1
            self.stats.compiling_steps.append(record.index)

    def stop_window(self) -> None:
        if self._counting:  # a break is found when its frame compiles: the job's whole count says more
            self.stats.graph_breaks = _graph_breaks()
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        if not self.calls and not self.seen:
            draft.compile = None  # torch.compile not used
            return
        stats = self.stats
        # the call that passed dynamic=False, where one did (the recompiles' likely source), else the first
        static = [(d, s) for d, s in self.calls if d is False]
        dynamic, site = (static or self.calls or [(None, None)])[0]
        reasons = self.window_reasons or self.all_reasons  # a window without recompiles: why they came before
        draft.compile = CompileStats(
            compiled_frames=stats.compiled_frames,
            recompiles=stats.recompiles,
            graph_breaks=stats.graph_breaks,
            compile_s=round(stats.compile_s, 4),
            steps_compiling=stats.steps_compiling,
            cache_limit_hit=self.limit_hit,
            reasons=[r for r, _ in reasons.most_common(REASONS_KEPT)],
            dynamic=dynamic,
            site=site,
            recompile_limit=_recompile_limit(),
            limit_frame=self.limit_frame,
            compiles_before_window=self.before,
            compiling_steps=list(stats.compiling_steps),
        )
