"""Issue 40 in ``pitstop attach``'s sampled view: what stacks show of the settings and calls that slow every
step, turned into the records the live probe fills (``JobCall``, ``CompileStats``, ``DebugModes``,
``DdpSettings``) so the same rules read them, each finding marked as sampled.

Two recorded windows (py-spy 0.4.3 on this machine, ``--idle --nonblocking --subprocesses``, trimmed to 300
samples, paths made neutral): a loop with ``torch.autograd.set_detect_anomaly(True)`` and a loop whose
``torch.compile(dynamic=False)`` recompiles on every new batch size. What needs the text of the line a sample
was on (``gc.collect()`` has no frame of its own; DDP's search is one line of ``distributed.py``) is built from
hand-made stacks over files written here, since a recorded line number names one torch release's line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pitstop.attach.build import build_profile
from pitstop.attach.evidence import SOURCE_LIMIT, Sources, env_settings, rank_evidence, with_log
from pitstop.attach.sampled import annotate
from pitstop.attach.sampler import Window, read_speedscope
from pitstop.attach.stacks import Frame, Stack, ThreadSamples
from pitstop.attach.view import job_view
from pitstop.core.profile import CompileStats, DdpSettings
from pitstop.diagnose import diagnose

RECORDED = Path(__file__).resolve().parent / "recorded"
NOPID = 99_999_999  # above any pid_max: /proc knows nothing of it


def _recorded(name: str) -> Window:
    window = Window(pid=NOPID, seconds=3.0, rate_hz=100.0)
    window.threads = read_speedscope(json.loads((RECORDED / name).read_text()), 0.01)
    return window


def _window(stacks: list[Stack], pid: int = NOPID) -> Window:
    main = ThreadSamples(pid=pid, tid=pid, name="MainThread", interval_s=0.01, stacks=stacks)
    return Window(pid=pid, seconds=len(stacks) * 0.01, rate_hz=100.0, threads=[main])


def test_speedscope_frames_keep_their_line() -> None:
    window = _recorded("attach_anomaly_mode.json")
    lines = {f.line for stack in window.threads[0].stacks for f in stack}
    assert 0 not in lines and len(lines) > 10


def test_anomaly_mode_from_its_stack_recording() -> None:
    view = job_view(_recorded("attach_anomaly_mode.json"))
    profile = build_profile(view)
    rank = profile.ranks[0]
    modes = rank.debug_modes
    assert modes is not None and modes.anomaly_steps == len(rank.steps) > 10  # on in every step
    assert rank.job_calls == [] and rank.compile is None and rank.ddp is None
    finding = next(f for f in annotate(diagnose(profile), view).findings if f.cause == "debug_modes")
    assert finding.evidence["view"] == "sampled" and finding.evidence["anomaly_detection_steps"] == len(
        rank.steps
    )
    assert 0.1 < finding.evidence["sampled_share"] < 0.9  # the samples inside torch.fx.traceback.format_stack
    assert finding.evidence["samples"] == 300
    assert finding.confidence < 0.95  # a sampled view, not a timed one


def test_recompiling_from_dynamos_frames() -> None:
    view = job_view(_recorded("attach_recompiling.json"))
    profile = build_profile(view)
    stats = profile.ranks[0].compile
    assert stats is not None
    assert stats.compiled_frames >= 2 and 1 <= stats.recompiles < stats.compiled_frames + 1
    assert stats.compile_s > 1.0 and stats.steps_compiling >= 1  # most of the window compiles
    assert profile.ranks[0].job_calls == []  # dynamo's own gc.collect while compiling is not the job's
    finding = next(f for f in annotate(diagnose(profile), view).findings if f.cause == "recompiles")
    assert finding.evidence["view"] == "sampled" and finding.evidence["sampled_share"] > 0.5


# --- hand-made stacks over real files -------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A job's file and the library files its stacks pass through, each with the lines the samples were on."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    files = {
        "job": tmp_path / "job" / "train.py",
        "accelerate": site / "accelerate" / "utils" / "memory.py",
        "dynamo": site / "torch" / "_dynamo" / "convert_frame.py",
        "ddp": site / "torch" / "nn" / "parallel" / "distributed.py",
        "cuda": site / "torch" / "cuda" / "memory.py",
        "trainer": site / "transformers" / "trainer.py",
        "module": site / "torch" / "nn" / "modules" / "module.py",
        "tensor": site / "torch" / "_tensor.py",
        "optim": site / "torch" / "optim" / "optimizer.py",
    }
    body = {
        "job": "import gc\n\ndef step():\n    loss = model(x)\n    loss.backward()\n    opt.step()\n    gc.collect()\n"
        "    release_memory()\n",
        "accelerate": "def clear_device_cache(garbage_collection=False):\n    if garbage_collection:\n"
        "        gc.collect()\n    torch.cuda.empty_cache()\n",
        "dynamo": "def _compile():\n    gc.collect()\n",
        "ddp": "def _post_forward(self, output):\n    if self.find_unused_parameters and not self.static_graph:\n"
        "        self.reducer.prepare_for_backward(list(_find_tensors(output)))\n    else:\n"
        "        self.reducer.prepare_for_backward([])\n",
    }
    for key, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body.get(key, "\n" * 50))
    return files


def _f(tree: dict[str, Path], key: str, name: str, line: int) -> Frame:
    return Frame(name, str(tree[key]), line)


def _steps(tree: dict[str, Path], n: int, extra: Stack, extra_samples: int) -> list[Stack]:
    """n steps of forward 3, backward 3, optimizer 1, then ``extra`` for ``extra_samples`` samples."""
    loop = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 4))
    forward = (*loop, _f(tree, "module", "Module._call_impl", 9))
    backward = (loop[0], _f(tree, "job", "step", 5), _f(tree, "tensor", "Tensor.backward", 3))
    optimizer = (loop[0], _f(tree, "job", "step", 6), _f(tree, "optim", "SGD.step", 4))
    out: list[Stack] = []
    for _ in range(n):
        out += [forward] * 3 + [backward] * 3 + [optimizer] + [extra] * extra_samples
    return out


def test_the_jobs_gc_collect_is_named_at_its_line(tree: dict[str, Path]) -> None:
    collect = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 7))  # C: no frame of its own
    view = job_view(_window(_steps(tree, 20, collect, 4)))
    profile = build_profile(view)
    rank = profile.ranks[0]
    (call,) = rank.job_calls or []
    assert call.call == "gc.collect" and call.site == f"{tree['job']}:7 in step" and call.via is None
    assert call.count == 20  # one run of samples per call
    assert call.steps >= len(rank.steps) - 1 and call.seconds == pytest.approx(0.8)
    finding = next(f for f in annotate(diagnose(profile), view).findings if f.cause == "per_step_cleanup")
    assert finding.evidence["view"] == "sampled"
    assert finding.evidence["sampled_share"] == pytest.approx(80 / 220, abs=0.01)


def test_a_librarys_call_is_named_with_the_jobs_line_and_the_setting(tree: dict[str, Path]) -> None:
    job = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 8))
    by_helper = (*job, _f(tree, "accelerate", "clear_device_cache", 3))  # accelerate's gc.collect()
    cache = (
        Frame("<module>", str(tree["job"]), 10),
        _f(tree, "trainer", "Trainer.train", 5),
        _f(tree, "trainer", "Trainer.training_step", 9),
        _f(tree, "accelerate", "clear_device_cache", 4),
        _f(tree, "cuda", "empty_cache", 7),
    )
    dynamo = (*job, _f(tree, "dynamo", "_compile", 2))  # torch's own, while compiling
    stacks = _steps(tree, 6, by_helper, 2) + _steps(tree, 6, cache, 2) + _steps(tree, 6, dynamo, 2)
    calls = {c.call: c for c in build_profile(job_view(_window(stacks))).ranks[0].job_calls or []}
    assert set(calls) == {"gc.collect", "torch.cuda.empty_cache"}
    gc_call, flush = calls["gc.collect"], calls["torch.cuda.empty_cache"]
    assert gc_call.site == f"{tree['job']}:8 in step"
    assert gc_call.via == "accelerate/utils/memory.py:3 in clear_device_cache" and gc_call.count == 6
    assert flush.site == f"{tree['job']}:10 in <module>"
    assert flush.via == "accelerate/utils/memory.py:4 in clear_device_cache"
    assert flush.setting == "TrainingArguments(torch_empty_cache_steps)"


def test_ddps_search_is_its_own_line(tree: dict[str, Path]) -> None:
    loop = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 4))
    search = (
        *loop,
        _f(tree, "module", "Module._call_impl", 9),
        _f(tree, "ddp", "DistributedDataParallel._post_forward", 3),
    )
    no_search = (*search[:-1], _f(tree, "ddp", "DistributedDataParallel._post_forward", 5))
    rank = build_profile(job_view(_window(_steps(tree, 10, search, 1)))).ranks[0]
    assert rank.ddp is not None and rank.ddp.find_unused_parameters is True
    assert rank.ddp.search_s == pytest.approx(0.1) and rank.ddp.searches >= 8
    assert rank.ddp.unused_parameters is None  # not in a stack: the rule stays quiet without the job's log
    assert build_profile(job_view(_window(_steps(tree, 10, no_search, 1)))).ranks[0].ddp is None


@pytest.mark.slow
def test_the_jobs_log_completes_what_the_samples_cannot_count(tree: dict[str, Path], tmp_path: Path) -> None:
    """A job writing its output to a file (``python train.py > train.log 2>&1``): DDP's own warning there
    says no parameter went unused, so the sampled search becomes a finding with its time."""
    log = tmp_path / "train.log"
    log.write_text(
        "[W1206 07:11:02.694694128 reducer.cpp:1529] Warning: find_unused_parameters=True was specified in DDP "
        "constructor, but did not find any unused parameters in the forward pass. This flag results in an extra "
        "traversal of the autograd graph every iteration\n"
    )
    loop = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 4))
    search = (
        *loop,
        _f(tree, "module", "Module._call_impl", 9),
        _f(tree, "ddp", "DistributedDataParallel._post_forward", 3),
    )
    with log.open("a") as out:
        job = subprocess.Popen(["sleep", "60"], stdout=out, stderr=subprocess.STDOUT)
    try:
        view = job_view(_window(_steps(tree, 10, search, 1), pid=job.pid))
        profile = build_profile(view)
    finally:
        job.kill()
        job.wait()
    ddp = profile.ranks[0].ddp
    assert ddp is not None and ddp.unused_parameters == 0 and ddp.search_s == pytest.approx(0.1)
    assert "train.log" in (ddp.set_by or "")
    assert any(f"read the job's output {log}" in n for n in profile.notes)
    finding = next(f for f in annotate(diagnose(profile), view).findings if f.cause == "ddp_find_unused")
    assert finding.est_speedup is not None and finding.evidence["view"] == "sampled"


def test_with_log_keeps_the_windows_times() -> None:
    sampled = CompileStats(compiled_frames=3, recompiles=2, compile_s=1.5, steps_compiling=3)
    logged = CompileStats(
        recompiles=40, cache_limit_hit=True, reasons=["tensor 'x' size mismatch"], recompile_limit=8
    )
    ddp, stats = with_log(None, sampled, None, logged, "train.log")
    assert ddp is None and stats is sampled
    assert stats.recompiles == 2 and stats.compile_s == 1.5  # the window's, not the run's
    assert (
        stats.cache_limit_hit and stats.reasons == ["tensor 'x' size mismatch"] and stats.recompile_limit == 8
    )
    ddp, stats = with_log(
        None, None, DdpSettings(find_unused_parameters=True, unused_parameters=0), logged, "x"
    )
    assert ddp is not None and ddp.unused_parameters == 0 and ddp.search_s is None and stats is logged


def test_debug_settings_from_the_processes_environment() -> None:
    def environ(pid: int, *names: str) -> dict[str, str]:
        env = {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "PATH": "/bin"}
        return {k: v for k, v in env.items() if k in names}

    assert env_settings(environ, 1) == ["CUDA_LAUNCH_BLOCKING=1", "TORCH_DISTRIBUTED_DEBUG=DETAIL"]


def test_sources_are_read_safely(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    big = tmp_path / "big.py"
    with big.open("w") as f:
        f.write("gc.collect()\n")
        f.truncate(SOURCE_LIMIT + 1)
    sources = Sources()
    assert sources.line(Frame("f", str(fifo), 1)) == ""  # never opened: it would block
    assert sources.line(Frame("f", str(big), 1)) == ""  # larger than any source file
    assert sources.line(Frame("f", str(tmp_path / "gone.py"), 1)) == ""
    assert sources.line(Frame("f", "<frozen importlib._bootstrap>", 3)) == ""


def test_no_evidence_where_the_samples_show_none(tree: dict[str, Path]) -> None:
    loop = (Frame("<module>", str(tree["job"]), 10), _f(tree, "job", "step", 4))
    evidence = rank_evidence(
        _steps(tree, 5, loop, 1), [0, 8, 16, 24, 32], 0.01, [True] * 40, 4, [], Sources()
    )
    assert evidence.job_calls == [] and evidence.compile is None and evidence.ddp is None
    assert evidence.debug_modes is not None and evidence.debug_modes.anomaly_steps == 0
