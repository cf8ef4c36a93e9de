"""What a rank's sampled stacks show of the settings and calls that slow every step, as the records the live
probe fills (so the same rules read them): time is samples × the sampling interval, counts are runs of
consecutive samples (a lower bound: a call shorter than one interval can fall between two samples).

* **explicit cleanup calls** (``JobCall``): ``gc.collect()`` runs in C, so it has no frame of its own; a
  sample inside it shows the calling frame on the line that calls it, and that line's text (read from the
  job's file) says ``gc.collect(``. ``torch.cuda.empty_cache`` is a Python function of torch's: its frame
  shows. Each is named with the job's line under which it ran, and the library's line that made it when the
  job's line did not (accelerate's ``clear_device_cache``, the Trainer's ``torch_empty_cache_steps``).
* **torch.compile compiling** (``CompileStats``): dynamo compiles inside ``torch/_dynamo/convert_frame.py``.
  A compile of the same call path seen again, or one that passes through dynamo's recompile-only functions
  (the guard-failure reasons), is a recompile; the rest are counted as compiled frames only.
* **anomaly detection** (``DebugModes``): in anomaly mode autograd records a Python stack for every node it
  makes, through ``torch/fx/traceback.py``'s ``format_stack``: a sample there is anomaly mode at work. The
  debug environment variables (``CUDA_LAUNCH_BLOCKING``, ``TORCH_DISTRIBUTED_DEBUG``) are read from
  ``/proc/PID/environ`` (the process's start-up environment).
* **eager attention** (``AttentionInfo.implementation = "eager"``): transformers' unfused path is a Python
  function, ``eager_attention_forward`` (each model's modeling file has its own copy); a model's own
  ``softmax(Q·Kᵀ)`` shows as a sample of the job's code on a line that calls ``softmax(`` with the scores'
  matmul (``@``, ``matmul``, ``bmm``, ``einsum``) a few lines above. Only the forward is seen: the backward
  runs in autograd's C++ engine, below ``loss.backward()``.
* **padding** (``Environment.packing = False``): a stack holds no tokens, so the pad share is not counted; what
  shows that batches are padded is the collate (transformers' ``data_collator.py``, a tokenizer's ``pad``) in
  the samples and, in the job's own files that the samples name, a ``padding="max_length"`` argument.
* **DDP's unused-parameter search** (``DdpSettings``): DDP runs it after each forward, on the line of
  ``torch/nn/parallel/distributed.py`` that calls ``prepare_for_backward(list(_find_tensors(output)))``,
  reached only with ``find_unused_parameters=True`` and no static graph. A sample on that line (or in
  ``_find_tensors``) is the search.

A file the job's frames name is read only when it is a regular file of at most ``SOURCE_LIMIT`` bytes, once
per window."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.attach.stacks import Frame, Stack
from pitstop.core.profile import AttentionInfo, CompileStats, DdpSettings, DebugModes, JobCall
from pitstop.regular import regular_problem

SOURCE_LIMIT = 4 * 2**20  # a Python source file is far smaller; a larger one is not read
GC_COLLECT = re.compile(r"\bgc\s*\.\s*collect\s*\(")
EMPTY_CACHE_FILES = re.compile(r"torch/(cuda|mps|xpu)/(?:memory|__init__)\.py$")
DYNAMO_COMPILE = "torch/_dynamo/convert_frame.py"
RECOMPILE_ONLY = {  # dynamo's functions that run only when a frame already has compiled code: a recompile
    "get_and_maybe_log_recompilation_reasons",
    "update_diff_guard_managers_for_existing_cache_entries",
}
ANOMALY_FILE = "torch/fx/traceback.py"  # format_stack: autograd's anomaly mode records each node's stack
DDP_FILE = "torch/nn/parallel/distributed.py"
DDP_SEARCH = "_find_tensors"  # on the search's line, and its own function
LIBRARY_PATHS = ("/site-packages/", "/dist-packages/")
TRAINER_STEP = "training_step"  # the Trainer empties the cache there on torch_empty_cache_steps
STDLIB = re.compile(r"/lib/python\d+\.\d+/")
EAGER_ATTENTION = "eager_attention_forward"  # transformers' unfused attention, one copy per modeling file
SOFTMAX_CALL = re.compile(r"\bsoftmax\s*\(")
SCORES_MATMUL = re.compile(
    r"[\w)\]]\s*@\s*[\w(]|\b(?:matmul|bmm|baddbmm|einsum)\s*\("
)  # Q·Kᵀ, not a decorator
SCORES_ABOVE = 6  # lines above a softmax call searched for the scores' matmul (a scale, a mask between)
FUNCTION_START = re.compile(r"\s*(?:async\s+)?(?:def|class)\s")
COLLATE_FILE = "transformers/data/data_collator.py"
TOKENIZER_PAD = ("transformers/tokenization_utils_base.py", "pad")  # tokenizer.pad: a collate that pads
MAX_LENGTH_PADDING = re.compile(r"""\bpadding\s*=\s*(["'])max_length\1""")
PADS_TO = re.compile(r"\bmax_length\s*=\s*(\d+)\b")
ANOMALY_ALL_STEPS = 0.5  # anomaly seen in at least this share of the steps that sampled compute: on in all


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def is_library(frame: Frame) -> bool:
    """Installed code (a package, the standard library, a frozen module), as opposed to the job's own."""
    path = _path(frame)
    return path.startswith("<") or any(p in path for p in LIBRARY_PATHS) or bool(STDLIB.search(path))


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def where(frame: Frame) -> str:
    """A frame as the live probe names a site: the job's file by its path (``/job/train.py:42 in main``), a
    library's from its package on (``accelerate/utils/memory.py:34 in clear_device_cache``)."""
    name = frame.file
    for marker in LIBRARY_PATHS:
        if marker in name:
            name = name.rsplit(marker, 1)[1]
            break
    return f"{name}:{frame.line} in {_short(frame.name)}" if frame.line else f"{name} in {_short(frame.name)}"


def _torch_own(frame: Frame) -> bool:
    """torch's own code (dynamo collects garbage while it compiles): not a cleanup the job asked for."""
    path = _path(frame)
    return is_library(frame) and "/torch/" in path and not EMPTY_CACHE_FILES.search(path)


class Sources:
    """The text of the lines the samples were on, read from the job's files once each (bounded)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._files: dict[str, list[str] | None] = {}

    def line(self, frame: Frame) -> str:
        if frame.line <= 0 or frame.file.startswith("<"):
            return ""
        lines = self._files.get(frame.file)
        if frame.file not in self._files:
            lines = self._files[frame.file] = self._read(frame.file)
        if lines is None or frame.line > len(lines):
            return ""
        return lines[frame.line - 1]

    def lines(self, name: str) -> list[str]:
        """All the lines of one of the job's files (empty when it cannot be read, or is too large)."""
        if name not in self._files:
            self._files[name] = self._read(name)
        return self._files[name] or []

    def _read(self, name: str) -> list[str] | None:
        candidates = [Path(name)]
        if self.pid is not None and name.startswith("/"):  # the job may see another root (a container)
            candidates.append(Path(f"/proc/{self.pid}/root") / name.lstrip("/"))
        elif self.pid is not None:  # a name relative to the job's working folder, not pitstop's
            candidates = [Path(f"/proc/{self.pid}/cwd") / name]
        for path in candidates:
            try:
                if regular_problem(path) is not None or not path.exists():
                    continue
                if path.stat().st_size > SOURCE_LIMIT:
                    return None
                return path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
        return None


@dataclass
class PaddingSeen:
    """What samples and the job's files show of padding: no tokens, so no pad share."""

    collate: str | None = None  # the padding collate seen ("DataCollatorForLanguageModeling")
    collate_samples: int = 0
    # the job's lines with padding="max_length": ("path:line", the line's code)
    max_length_lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def pads_to(self) -> int | None:
        """The length the first such line pads to, where it says it as a number (``max_length=256``)."""
        found = PADS_TO.search(self.max_length_lines[0][1]) if self.max_length_lines else None
        return int(found.group(1)) if found else None


@dataclass
class RankEvidence:
    """One rank's records from its samples; None where the samples show nothing of it."""

    job_calls: list[JobCall] = field(default_factory=list)
    compile: CompileStats | None = None
    debug_modes: DebugModes | None = None
    ddp: DdpSettings | None = None
    attention: AttentionInfo | None = None
    attention_library: str | None = None  # "transformers" when its eager_attention_forward ran
    padding: PaddingSeen | None = None


def _step_of(starts: Sequence[int], n: int) -> list[int]:
    """The step each sample belongs to (-1 before the first step start); one step when no starts."""
    if len(starts) < 2:
        return [0] * n
    out, step, nxt = [], -1, 0
    for i in range(n):
        while nxt < len(starts) and i >= starts[nxt]:
            step, nxt = nxt, nxt + 1
        out.append(step if step < len(starts) - 1 else -1)  # after the last start: not a whole step
    return out


def _runs(flags: Sequence[bool]) -> list[int]:
    """The sample indices where a run of flagged samples begins."""
    return [i for i, on in enumerate(flags) if on and (i == 0 or not flags[i - 1])]


def cleanup_call(stack: Stack, sources: Sources) -> tuple[str, int] | None:
    """(the call, the index of the frame that made it) for a sample inside an explicit cleanup call; torch's
    own calls (dynamo's collection while compiling) are left out."""
    found: tuple[str, int] | None = None
    for i, frame in enumerate(stack):  # outermost first: the outermost match is the call the caller made
        device = EMPTY_CACHE_FILES.search(_path(frame))
        if device and _short(frame.name) == "empty_cache" and i > 0:
            found = f"torch.{device.group(1)}.empty_cache", i - 1
            break
    if found is None and stack and GC_COLLECT.search(sources.line(stack[-1])):
        found = "gc.collect", len(stack) - 1
    if found is None or _torch_own(stack[found[1]]):
        return None
    return found


def _site(stack: Stack, caller: int) -> tuple[str, str | None, str | None]:
    """(the job's line under which the call ran, the library's line that made it when not the job's own, the
    setting that asked a library for it)."""
    setting = None
    for i in range(caller, -1, -1):
        frame = stack[i]
        if _short(frame.name) == TRAINER_STEP and "transformers/" in _path(frame):
            setting = "TrainingArguments(torch_empty_cache_steps)"
        if not is_library(frame):
            return where(frame), (None if i == caller else where(stack[caller])), setting
    return where(stack[caller]), where(stack[caller]), setting  # no job frame: a library's own loop


def job_calls(stacks: Sequence[Stack], steps: Sequence[int], dt: float, sources: Sources) -> list[JobCall]:
    """Explicit cleanup calls, grouped by (call, site, via, setting), most time first. ``collected`` stays 0:
    what a collection found is not in a stack."""
    keys = []
    for stack in stacks:
        found = cleanup_call(stack, sources)
        keys.append(None if found is None else (found[0], *_site(stack, found[1])))
    calls: dict[tuple[str, str, str | None, str | None], JobCall] = {}
    step_sets: dict[tuple[str, str, str | None, str | None], set[int]] = defaultdict(set)
    for i, key in enumerate(keys):
        if key is None:
            continue
        call = calls.setdefault(key, JobCall(call=key[0], site=key[1], via=key[2], setting=key[3]))
        call.seconds += dt
        if i == 0 or keys[i - 1] != key:
            call.count += 1
        if steps[i] >= 0:
            step_sets[key].add(steps[i])
    for key, call in calls.items():
        call.steps = len(step_sets[key])
        call.seconds = round(call.seconds, 6)
    return sorted(calls.values(), key=lambda c: -c.seconds)


def compiling(stack: Stack) -> bool:
    return any(_path(f).endswith(DYNAMO_COMPILE) for f in stack)


def _compile_path(stack: Stack) -> tuple[tuple[str, str, int], ...] | None:
    """The frames leading into dynamo's compile (the call path of the frame being compiled), or None when
    the sample is not compiling."""
    for i, frame in enumerate(stack):
        if _path(frame).endswith(DYNAMO_COMPILE):
            return tuple((f.name, f.file, f.line) for f in stack[:i] if "torch/_dynamo/" not in _path(f))
    return None


def compile_stats(stacks: Sequence[Stack], steps: Sequence[int], dt: float) -> CompileStats | None:
    """Compiling seen in the samples: time, compiles (runs of samples), recompiles (a lower bound)."""
    paths = [_compile_path(s) for s in stacks]
    compiling = [p is not None for p in paths]
    starts = _runs(compiling)
    if not starts:
        return None
    per_path: Counter[tuple[tuple[str, str, int], ...]] = Counter()
    marked = 0
    for start in starts:
        path = paths[start]
        assert path is not None
        per_path[path] += 1
        end = start
        while end < len(stacks) and compiling[end]:
            end += 1
        if any(_short(f.name) in RECOMPILE_ONLY for s in stacks[start:end] for f in s):
            marked += 1
    again = sum(n - 1 for n in per_path.values())
    return CompileStats(
        compiled_frames=len(starts),
        recompiles=min(len(starts), max(again, marked)),
        compile_s=round(sum(compiling) * dt, 6),
        steps_compiling=len({steps[i] for i, on in enumerate(compiling) if on and steps[i] >= 0}),
    )


def anomaly(stack: Stack) -> bool:
    return any(_path(f).endswith(ANOMALY_FILE) and _short(f.name) == "format_stack" for f in stack)


def debug_modes(
    stacks: Sequence[Stack],
    steps: Sequence[int],
    computing: Sequence[bool],
    n_steps: int,
    settings: list[str],
) -> DebugModes:
    """Anomaly mode from its stack recording, per step; the debug settings of the process's environment.
    Anomaly mode is a global switch (or a context around each step): seen in at least ANOMALY_ALL_STEPS of
    the steps whose compute was sampled, it counts for every step; else for the steps it was seen in."""
    seen = {steps[i] for i, s in enumerate(stacks) if steps[i] >= 0 and anomaly(s)}
    sampled = {steps[i] for i, c in enumerate(computing) if c and steps[i] >= 0}
    anomaly_steps = len(seen)
    if seen and len(seen) >= ANOMALY_ALL_STEPS * max(len(sampled), 1):
        anomaly_steps = n_steps
    return DebugModes(anomaly_steps=anomaly_steps, settings=list(settings))


def in_ddp_search(stack: Stack, sources: Sources) -> bool:
    for frame in stack:
        if not _path(frame).endswith(DDP_FILE):
            continue
        if _short(frame.name) == DDP_SEARCH or f"{DDP_SEARCH}(" in sources.line(frame):
            return True
    return False


def ddp_search(
    stacks: Sequence[Stack], steps: Sequence[int], dt: float, sources: Sources
) -> DdpSettings | None:
    """DDP's unused-parameter search, where samples caught it (None: not seen, which does not say it is off:
    a search shorter than the interval falls between samples)."""
    hits = [in_ddp_search(s, sources) for s in stacks]
    if not any(hits):
        return None
    return DdpSettings(
        find_unused_parameters=True,  # who asked for it is not in a stack: set_by stays unknown
        search_s=round(sum(hits) * dt, 6),
        searches=len({steps[i] for i, h in enumerate(hits) if h and steps[i] >= 0}),
    )


def eager_attention(stack: Stack, sources: Sources) -> Frame | None:
    """The frame that shows one sample inside an unfused attention: transformers' ``eager_attention_forward``,
    or the innermost frame of the job's own code on a ``softmax(`` line with the scores' matmul just above (a
    model's own ``softmax(Q·Kᵀ)``); None for any other sample."""
    for frame in stack:
        if _short(frame.name) == EAGER_ATTENTION:
            return frame
    own = next((f for f in reversed(stack) if not is_library(f)), None)
    if own is None or own.line <= 0 or not SOFTMAX_CALL.search(sources.line(own)):
        return None
    lines = sources.lines(own.file)
    for text in reversed(lines[max(0, own.line - 1 - SCORES_ABOVE) : own.line - 1]):
        if SCORES_MATMUL.search(text):
            return own
        if FUNCTION_START.match(text):  # the scores are the same function's
            return None
    return None


def attention_sites(stacks: Sequence[Stack], sources: Sources) -> Counter[str]:
    """Where the samples saw the unfused attention (``where`` of each frame, without its line: one site per
    function), with how many samples each."""
    seen: Counter[str] = Counter()
    for stack in stacks:
        frame = eager_attention(stack, sources)
        if frame is not None:
            seen[where(Frame(frame.name, frame.file))] += 1
    return seen


def seen_attention(stacks: Sequence[Stack], sources: Sources) -> tuple[AttentionInfo | None, str | None]:
    """The eager path as the record the live probe fills, where samples caught it (None: not seen, which
    does not say it is not eager: an attention shorter than the interval falls between samples), and
    "transformers" when its own function ran (the model is a transformers model)."""
    sites = attention_sites(stacks, sources)
    if not sites:
        return None, None
    library = "transformers" if any(s.startswith("transformers/") for s in sites) else None
    return AttentionInfo(implementation="eager"), library


def padding_collate(stack: Stack) -> str | None:
    """The padding collate a sample is in: one of transformers' data collators that pad each batch (not
    ``DefaultDataCollator``, nor ``DataCollatorWithFlattening``, which packs), or a tokenizer's ``pad``."""
    from pitstop.remedies.trim_padding import pads_per_batch

    for frame in stack:
        path = _path(frame)
        owner = frame.name.split(".", 1)[0]
        if COLLATE_FILE in path and "." in frame.name and pads_per_batch(owner):
            return owner
        if path.endswith(TOKENIZER_PAD[0]) and _short(frame.name) == TOKENIZER_PAD[1]:
            return f"{frame.name.rsplit('.', 1)[0]}.pad"
    return None


def padding_seen(stacks: Sequence[Stack], sources: Sources) -> PaddingSeen | None:
    """The collate in the samples, and ``padding="max_length"`` in the job's own files the samples name (a
    dataset tokenized before the window pads in no sample, but its line is in the job's script)."""
    collates = Counter(c for c in map(padding_collate, stacks) if c is not None)
    own = sorted({f.file for stack in stacks for f in stack if not is_library(f)})
    lines = [
        (f"{name}:{number}", text.strip())
        for name in own
        for number, text in enumerate(sources.lines(name), 1)
        if MAX_LENGTH_PADDING.search(text) and not text.lstrip().startswith("#")
    ]
    if not collates and not lines:
        return None
    collate, count = collates.most_common(1)[0] if collates else (None, 0)
    return PaddingSeen(collate=collate, collate_samples=count, max_length_lines=lines)


def rank_evidence(
    stacks: Sequence[Stack],
    starts: Sequence[int],
    dt: float,
    computing: Sequence[bool],
    n_steps: int,
    settings: list[str],
    sources: Sources,
) -> RankEvidence:
    """All of a rank's records from its main thread's samples (``starts``: the sample index of each counted
    step's start; ``computing``: the samples in forward or backward)."""
    steps = _step_of(starts, len(stacks))
    attention, library = seen_attention(stacks, sources)
    return RankEvidence(
        job_calls=job_calls(stacks, steps, dt, sources),
        compile=compile_stats(stacks, steps, dt),
        debug_modes=debug_modes(stacks, steps, computing, n_steps, settings),
        ddp=ddp_search(stacks, steps, dt, sources),
        attention=attention,
        attention_library=library,
        padding=padding_seen(stacks, sources),
    )


def env_settings(read: Callable[..., dict[str, str]], pid: int) -> list[str]:
    """The process's debug settings from its start-up environment, as the live collector names them."""
    from pitstop.probe.collectors.debug_modes import ENV_SETTINGS, settings_on

    return settings_on(read(pid, *ENV_SETTINGS), deterministic=False)


def with_log(
    ddp: DdpSettings | None,
    compile: CompileStats | None,
    logged_ddp: DdpSettings | None,
    logged_compile: CompileStats | None,
    where: str,
) -> tuple[DdpSettings | None, CompileStats | None]:
    """The sampled records completed by what the job's own log says: DDP's warning that every parameter got
    a gradient (the samples cannot count parameters), dynamo's recompile limit and guard failures (the samples
    cannot read them). The window's times stay the samples'; a log's counts are the whole run's, kept only
    where the samples saw no compiling."""
    if logged_ddp is not None:
        if ddp is None:
            ddp = DdpSettings(
                find_unused_parameters=True, unused_parameters=0, set_by=f"DDP's own warning in {where}"
            )
        else:
            ddp.unused_parameters = logged_ddp.unused_parameters
            ddp.set_by = ddp.set_by or f"DDP's own warning in {where}"
    if logged_compile is not None:
        if compile is None:
            compile = logged_compile
        else:
            compile.cache_limit_hit = compile.cache_limit_hit or logged_compile.cache_limit_hit
            compile.reasons = compile.reasons or logged_compile.reasons
            compile.recompile_limit = compile.recompile_limit or logged_compile.recompile_limit
            compile.limit_frame = compile.limit_frame or logged_compile.limit_frame
            compile.graph_breaks = max(compile.graph_breaks, logged_compile.graph_breaks)
    return ddp, compile
