"""pitstop attach's pure logic on hand-made stack samples (no process, no py-spy): what a stack is doing,
the shares and their intervals, steps from sample sequences, py-spy's speedscope document, and a sampled
window's way through the same rules as doctor."""

from __future__ import annotations

import time
import types

import pytest

from pitstop.attach.build import build_profile, steps_of
from pitstop.attach.classify import Phase, classify, framework_of, in_optimizer_step, is_worker, loader_kind
from pitstop.attach.gpus import watch_gpus
from pitstop.attach.sampled import annotate
from pitstop.attach.sampler import Window, _errors, _ids, read_speedscope
from pitstop.attach.shares import Share, count_steps, cycle_starts, optimizer_entries, wilson
from pitstop.attach.stacks import Frame, ThreadSamples
from pitstop.attach.view import job_view
from pitstop.diagnose import diagnose

SITE = "/venv/lib/python3.11/site-packages/"
NOPID = 99_999_999  # above any pid_max: /proc knows nothing of it

LOOP = (Frame("<module>", "/job/train.py"), Frame("main", "/job/train.py"))
DATA = (
    *LOOP,
    Frame("_BaseDataLoaderIter.__next__", SITE + "torch/utils/data/dataloader.py"),
    Frame("_SingleProcessDataLoaderIter._next_data", SITE + "torch/utils/data/dataloader.py"),
    Frame("_MapDatasetFetcher.fetch", SITE + "torch/utils/data/_utils/fetch.py"),
    Frame("SlowDataset.__getitem__", "/job/train.py"),
)
FORWARD = (
    *LOOP,
    Frame("Module._wrapped_call_impl", SITE + "torch/nn/modules/module.py"),
    Frame("Module._call_impl", SITE + "torch/nn/modules/module.py"),
    Frame("Linear.forward", SITE + "torch/nn/modules/linear.py"),
)
BACKWARD = (
    *LOOP,
    Frame("Tensor.backward", SITE + "torch/_tensor.py"),
    Frame("backward", SITE + "torch/autograd/__init__.py"),
    Frame("_engine_run_backward", SITE + "torch/autograd/graph.py"),
)
OPT = (
    *LOOP,
    Frame("Optimizer.profile_hook_step.<locals>.wrapper", SITE + "torch/optim/optimizer.py"),
    Frame("_use_grad_for_differentiable.<locals>._use_grad", SITE + "torch/optim/optimizer.py"),
    Frame("SGD.step", SITE + "torch/optim/sgd.py"),
)
ZERO_GRAD = (*LOOP, Frame("Optimizer.zero_grad", SITE + "torch/optim/optimizer.py"))
SAVE = (
    *LOOP,
    Frame("save", SITE + "torch/serialization.py"),
    Frame("_save", SITE + "torch/serialization.py"),
)
EVAL_FWD = (*LOOP[:1], Frame("Trainer.evaluate", SITE + "transformers/trainer.py"), *FORWARD[2:])
ALLREDUCE = (
    *LOOP,
    Frame("_exception_logger.<locals>.wrapper", SITE + "torch/distributed/c10d_logger.py"),
    Frame("all_reduce", SITE + "torch/distributed/distributed_c10d.py"),
)
WORKER = (
    Frame("_worker_loop", SITE + "torch/utils/data/_utils/worker.py"),
    Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py"),
)


def test_each_phase_is_named_from_its_frames() -> None:
    assert classify(DATA) is Phase.DATA
    assert classify(FORWARD) is Phase.FORWARD
    assert classify(BACKWARD) is Phase.BACKWARD
    assert classify(OPT) is Phase.OPTIMIZER
    assert classify(ZERO_GRAD) is Phase.OPTIMIZER
    assert classify(SAVE) is Phase.SAVE
    assert classify(ALLREDUCE) is Phase.COLLECTIVE
    assert classify(LOOP) is Phase.OTHER
    assert classify(()) is Phase.OTHER  # an idle tick with no Python frame


def test_an_outer_context_wins_over_what_it_calls() -> None:
    assert classify(EVAL_FWD) is Phase.EVAL  # a forward inside evaluation is evaluation
    save_in_step = (*OPT, Frame("save", SITE + "torch/serialization.py"))
    assert classify(save_in_step) is Phase.SAVE
    user_save = (*LOOP, Frame("Logger.save", "/job/log.py"))
    assert classify(user_save) is Phase.OTHER  # only torch's / safetensors' 'save' is a checkpoint


def test_the_optimizer_step_is_not_zero_grad_nor_the_scheduler() -> None:
    assert in_optimizer_step(OPT)
    assert not in_optimizer_step(ZERO_GRAD)
    sched = (*LOOP, Frame("LRScheduler.step", SITE + "torch/optim/lr_scheduler.py"))
    assert not in_optimizer_step(sched)
    accel = (*LOOP, Frame("AcceleratedOptimizer.step", SITE + "accelerate/optimizer.py"))
    assert in_optimizer_step(accel)


def test_framework_worker_and_loader_kind() -> None:
    assert framework_of([DATA, FORWARD]) == "pytorch"
    assert framework_of([EVAL_FWD]) == "hf_trainer"
    trl = (Frame("SFTTrainer.train", SITE + "trl/trainer/sft_trainer.py"), *EVAL_FWD)
    assert framework_of([trl]) == "trl"
    assert framework_of([(Frame("fit", SITE + "lightning/pytorch/trainer/trainer.py"),)]) == "lightning"
    assert framework_of([LOOP]) is None
    assert is_worker([WORKER]) and not is_worker([DATA])
    assert loader_kind([DATA]) == "single"
    multi = (
        *LOOP,
        Frame("_MultiProcessingDataLoaderIter._next_data", SITE + "torch/utils/data/dataloader.py"),
    )
    assert loader_kind([multi]) == "multi"
    assert loader_kind([FORWARD]) is None


def test_wilson_interval() -> None:
    lo, hi = wilson(80, 100)
    assert lo == pytest.approx(0.711, abs=1e-3) and hi == pytest.approx(0.867, abs=1e-3)
    assert wilson(0, 50)[0] == 0.0 and 0.05 < wilson(0, 50)[1] < 0.08  # never a zero-width interval
    assert wilson(50, 50)[1] == pytest.approx(1.0) and wilson(50, 50)[0] > 0.92
    assert wilson(0, 0) == (0.0, 1.0)
    assert Share(784, 798).text() == "98% (95% CI 97%–99%, 784/798 samples)"


def _steps(n: int, data: int, fwd: int, bwd: int, opt: int) -> list[tuple[Frame, ...]]:
    return ([DATA] * data + [FORWARD] * fwd + [BACKWARD] * bwd + [OPT] * opt) * n


def test_steps_from_optimizer_entries_when_the_step_is_sampled_well() -> None:
    stacks = _steps(5, data=6, fwd=2, bwd=3, opt=2)
    phases = [classify(s) for s in stacks]
    in_step = [in_optimizer_step(s) for s in stacks]
    assert optimizer_entries(in_step) == [11, 24, 37, 50, 63]
    count = count_steps(phases, in_step)
    assert count.method == "optimizer step" and count.resolved
    assert count.starts == [13, 26, 39, 52]  # a step starts where the optimizer's step ends
    assert count.steps == 3


def test_steps_from_cycles_when_the_optimizer_step_falls_between_samples() -> None:
    stacks = _steps(6, data=5, fwd=2, bwd=2, opt=0)
    phases = [classify(s) for s in stacks]
    count = count_steps(phases, [in_optimizer_step(s) for s in stacks])
    assert count.method == "forward/backward cycles"
    assert count.starts == [9, 18, 27, 36, 45] and count.steps == 4 and count.resolved


def test_steps_shorter_than_the_sampling_are_a_lower_bound() -> None:
    # 20 data samples, then a lone backward sample: the compute between batches is mostly missed
    phases = ([Phase.DATA] * 20 + [Phase.BACKWARD]) * 4 + [Phase.DATA]
    count = count_steps(phases, [False] * len(phases))
    assert cycle_starts(phases) == [21, 42, 63, 84]
    assert not count.resolved


def test_cycles_through_collectives_and_past_the_loops_own_code() -> None:
    d, f, b, c, o, x = (
        Phase.DATA,
        Phase.FORWARD,
        Phase.BACKWARD,
        Phase.COLLECTIVE,
        Phase.OPTIMIZER,
        Phase.OTHER,
    )
    # a data-parallel rank that waits in its gradient all_reduce: compute too short to be sampled
    assert cycle_starts([d, d, c, d, d, x, c, x, d]) == [3, 8]
    # FSDP gathers parameters inside the forward: a forward after a collective is the same micro-batch
    assert cycle_starts([d, f, c, f, b, c, o, x, d, f]) == [8]
    # a loader too fast to be sampled: a forward after the optimizer is the next step
    assert cycle_starts([f, b, o, f, b, x, f]) == [3, 6]
    # the waiting rank: its batch fetch is too short to be sampled, so its steps are not resolved
    waiting = ([c] * 8 + [b] + [c] * 8 + [d]) * 4
    count = count_steps(waiting, [False] * len(waiting))
    assert count.steps == 3 and not count.resolved


def test_speedscope_document_is_read_per_thread_in_order() -> None:
    doc = {
        "shared": {
            "frames": [
                {"name": 'process 42:"python train.py"', "file": "", "line": 0},
                {"name": "thread (42): MainThread", "file": "", "line": 0},
                *({"name": f.name, "file": f.file, "line": 1} for f in DATA[:3]),
                {"name": "Module._call_impl", "file": SITE + "torch/nn/modules/module.py", "line": 9},
            ]
        },
        "profiles": [
            {
                "name": 'Process 42 Thread 42 "MainThread"',
                "samples": [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1]],
            },
            {"name": 'Process 42 Thread 0x2B "pin"', "samples": [[0, 1]]},
            {"name": "something else", "samples": [[2]]},
        ],
    }
    threads = read_speedscope(doc, 0.01)
    assert [(t.pid, t.tid, t.name, t.is_main) for t in threads] == [
        (42, 42, "MainThread", True),
        (42, 43, "pin", False),
    ]
    main = threads[0]
    assert [classify(s) for s in main.stacks] == [Phase.DATA, Phase.FORWARD, Phase.OTHER]
    assert main.stacks[2] == ()  # py-spy's process / thread pseudo-frames are dropped
    assert _ids('Process 7 Thread 9 "x y"') == (7, 9, "x y")
    assert _errors("py-spy> Wrote speedscope file\npy-spy> Samples: 282 Errors: 17\n") == 17


def _window(stacks: list[tuple[Frame, ...]]) -> Window:
    main = ThreadSamples(pid=NOPID, tid=NOPID, name="MainThread", interval_s=0.01, stacks=stacks)
    return Window(pid=NOPID, seconds=len(stacks) * 0.01, rate_hz=100.0, threads=[main])


def test_a_planted_data_wait_is_found_with_its_sampled_evidence() -> None:
    view = job_view(_window(_steps(40, data=14, fwd=2, bwd=3, opt=1)))
    assert [r.pid for r in view.ranks] == [NOPID]
    rank = view.ranks[0]
    assert rank.framework == "pytorch" and rank.loader == "single"
    assert rank.shares[Phase.DATA] == Share(560, 800)
    assert rank.steps.steps == 38 and rank.step_rate == pytest.approx(5.0)  # the first step has no start
    profile = build_profile(view)
    assert profile.source == "attach"
    env = profile.ranks[0].environment
    assert env.dataloader.num_workers == 0 and env.device == "cpu" and env.framework == "pytorch"
    step = profile.ranks[0].steps[0]
    assert step.wall_s == pytest.approx(0.2) and step.data_wait_s == pytest.approx(0.14)
    assert step.tokens is None and step.real_tokens is None  # never guessed
    assert profile.totals is None  # no evaluation seen, no trainer_state.json
    diagnosis = annotate(diagnose(profile), view)
    found = {f.cause: f for f in diagnosis.findings}
    assert "dataloader_bound" in found
    finding = found["dataloader_bound"]
    assert finding.evidence["data_wait_frac"] == pytest.approx(0.7, abs=0.01)
    assert finding.evidence["sampled_share"] == 0.7 and finding.evidence["samples"] == 800
    lo, hi = finding.evidence["sampled_ci95"]
    assert lo < 0.7 < hi and finding.evidence["view"] == "sampled"
    assert finding.confidence == pytest.approx(0.9 * 0.85)  # sampled, not timed
    assert any(n.startswith("sampled view: py-spy at 100 Hz") for n in diagnosis.notes)
    assert "padding_waste" not in found  # tokens unknown: no padding finding from a sampled view


def test_evaluation_and_saves_become_shares_the_rules_read() -> None:
    stacks = _steps(20, data=0, fwd=3, bwd=4, opt=2) + [EVAL_FWD] * 60 + [SAVE] * 30
    view = job_view(_window(stacks))
    profile = build_profile(view)
    assert profile.totals is not None and profile.totals.eval_s == pytest.approx(0.6)
    saves = profile.ranks[0].checkpoints
    assert saves is not None and saves.saves == 1 and saves.save_s == pytest.approx(0.3)
    diagnosis = annotate(diagnose(profile), view)
    causes = {f.cause for f in diagnosis.findings}
    assert "eval_overhead" in causes
    assert "dataloader_bound" not in causes


def test_a_launcher_and_workers_are_not_ranks() -> None:
    window = _window(_steps(5, data=4, fwd=2, bwd=2, opt=2))
    window.threads.append(ThreadSamples(NOPID + 1, NOPID + 1, "MainThread", 0.01, [WORKER] * 50))
    launcher = (Frame("main", SITE + "torch/distributed/run.py"), Frame("sleep", "/x/time.py"))
    window.threads.append(ThreadSamples(NOPID + 2, NOPID + 2, "MainThread", 0.01, [launcher] * 50))
    view = job_view(window)
    assert [r.pid for r in view.ranks] == [NOPID]
    assert view.workers == [NOPID + 1] and view.others == [NOPID + 2]


def test_steps_of_a_window_without_two_step_starts_is_one_record() -> None:
    view = job_view(_window([DATA] * 30 + [FORWARD] * 5))
    records = steps_of(view.ranks[0])
    assert len(records) == 1 and records[0].wall_s == pytest.approx(0.35)
    assert build_profile(view).ranks[0].probe_errors  # said, not hidden


def test_figures_from_a_step_count_that_missed_steps_are_left_out() -> None:
    view = job_view(_window(([DATA] * 20 + [BACKWARD]) * 10 + [DATA]))
    assert not view.ranks[0].steps.resolved
    diagnosis = annotate(diagnose(build_profile(view)), view)
    finding = {f.cause: f for f in diagnosis.findings}["dataloader_bound"]
    assert finding.evidence["data_wait_ms_per_step"] is None
    assert "lower bound" in finding.speedup_basis
    assert any("at least" in note for note in diagnosis.notes)


class _FakeNvml:
    """pynvml's functions that attach calls, for two GPUs; NOPID runs on the second."""

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        return [types.SimpleNamespace(pid=NOPID)] if handle == 1 else [types.SimpleNamespace(pid=12)]

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> object:
        return types.SimpleNamespace(gpu=37 if handle == 1 else 99)


def test_the_gpu_a_rank_runs_on_comes_from_nvml_and_is_sampled() -> None:
    nvml = _FakeNvml()
    watch = watch_gpus({NOPID}, nvml)
    assert watch.of_pid == {NOPID: 1} and watch.names == {1: "NVIDIA H100 80GB HBM3"}
    window = _window(_steps(10, data=4, fwd=2, bwd=2, opt=2))
    watch.start(time.perf_counter())
    # sample until the readings cover the whole 1 s window (a busy machine runs the sampler's thread late)
    deadline = time.monotonic() + 60
    sampler = watch._samplers[1]
    while time.monotonic() < deadline and not (sampler.samples and sampler.samples[-1].t > window.seconds):
        time.sleep(0.05)
    watch.stop()
    assert nvml.shut and len(watch.samples[1]) >= 2 and {s.util for s in watch.samples[1]} == {37.0}
    window.gpu = watch
    profile = build_profile(job_view(window))
    rank = profile.ranks[0]
    assert rank.environment.device == "cuda" and rank.environment.gpu_name == "NVIDIA H100 80GB HBM3"
    assert rank.gpu_samples == watch.samples[1]
    diagnosis = diagnose(profile)  # the GPU rules read a sampled GPU run without failing on its unknowns
    assert diagnosis.metrics.gpu_util == pytest.approx(0.37)


def test_a_process_nvml_lists_on_two_gpus_holds_two() -> None:
    class DeviceMapped(_FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
            return [types.SimpleNamespace(pid=NOPID), types.SimpleNamespace(pid=12)]

    watch = watch_gpus({NOPID}, DeviceMapped())
    assert watch.of_pid == {NOPID: 0} and watch.held == {NOPID: 2}  # pid 12 is not the job's
    window = _window(_steps(10, data=4, fwd=2, bwd=2, opt=2))
    window.gpu = watch
    profile = build_profile(job_view(window))
    assert profile.ranks[0].environment.gpus_held == 2 and profile.gpus_held == 2
    alone = watch_gpus({NOPID}, _FakeNvml())
    assert alone.held == {NOPID: 1}


def test_without_nvml_the_gpus_are_not_sampled_and_it_is_said() -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise RuntimeError("driver not loaded")

    watch = watch_gpus({NOPID}, Broken())
    assert watch.of_pid == {} and "NVML unavailable (RuntimeError)" in watch.notes[0]
    watch.start(0.0)
    watch.stop()  # nothing to start or stop


def test_the_report_of_an_attached_job_is_titled_attach() -> None:
    import io

    from rich.console import Console

    from pitstop.report.terminal import render

    profile = build_profile(job_view(_window(_steps(40, data=14, fwd=2, bwd=3, opt=1))))
    out = io.StringIO()
    render(diagnose(profile), Console(file=out, width=120))
    assert "pitstop attach" in out.getvalue().splitlines()[0] and "pitstop doctor" not in out.getvalue()


def test_the_counted_line_says_where_a_sampled_view_found_its_steps_and_that_tokens_are_unknown() -> None:
    """Not 'counted from unknown · steps: optimizer step' (what a probed run's line would say): the steps came
    from frames in the stacks, the tokens from nowhere unless a log of the job's was read."""
    from pitstop.core.profile import RunTotals
    from pitstop.diagnose import counting_line

    well = build_profile(job_view(_window(_steps(40, data=14, fwd=2, bwd=3, opt=1))))
    assert well.ranks[0].step_boundary_reason == "sampled: forward/backward cycles"
    assert counting_line(well) == (
        "steps from forward/backward cycles in the sampled stacks (one per micro-batch) · "
        "tokens unknown (not in a stack, and no log of the job's was read)"
    )
    well.ranks[0].step_boundary_reason = "sampled: optimizer step, a lower bound"
    well.totals = RunTotals(tokens=123_456)  # a trainer_state.json was read
    assert counting_line(well) == (
        "steps from optimizer-step frames in the sampled stacks (a lower bound) · "
        "tokens from the job's trainer_state.json"
    )
    # a lone backward sample between batches: the steps are not resolved, and the line says so
    short = build_profile(job_view(_window(([DATA] * 20 + [BACKWARD]) * 4 + [DATA])))
    assert short.ranks[0].step_boundary_reason == "sampled: forward/backward cycles, a lower bound"
    assert str(counting_line(short)).startswith(
        "steps from forward/backward cycles in the sampled stacks (one"
    )
    assert "(a lower bound) · tokens unknown" in str(counting_line(short))
