"""The per-process probe: listens at the hooks, orchestrates the step timeline and the collectors, writes one
RankProfile.

Lifecycle: installed (zero-code bootstrap, a callback or ``pitstop.watch``) → first optimizer step:
read the environment, collectors begin (samplers start) → ``warmup`` steps → the window: collectors start →
``steps`` measured steps → finish: resolve device timings, collectors stop, each fills the RankProfile,
hand it over (file and/or callback) → optionally end the process (the zero-code runner's benchmark window).
Any internal error disables the probe with one warning; the training run goes on untouched.

Where a step ends and what it trained on is the step timeline's (``probe.steps``); every other measured
signal is a collector (``probe.collectors``), called at the same few moments (``collectors.base``).

Under the runner every finished step (and the samplers' new readings) is appended to the rank file at
once (``probe.stream``), so a process killed by a signal still leaves what it measured.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from pitstop.atomic import write_atomic
from pitstop.core.profile import (
    AttentionInfo,
    Environment,
    RankProfile,
    StepRecord,
    assemble_rank,
    to_jsonable,
)
from pitstop.core.vocabulary import Device
from pitstop.probe import environment as envmod
from pitstop.probe import gather
from pitstop.probe.collectors import COLLECTORS, Collector, ProbeContext, overrides
from pitstop.probe.collectors.attention import AttentionCollector
from pitstop.probe.collectors.autocast import AutocastCollector
from pitstop.probe.collectors.collate import CollateCollector
from pitstop.probe.collectors.failure import FailureCollector
from pitstop.probe.collectors.recompute import RecomputeCollector
from pitstop.probe.collectors.saves import trainer_save_steps
from pitstop.probe.collectors.syncs import SyncCollector
from pitstop.probe.config import ProbeConfig
from pitstop.probe.ending import end_the_job, fresh_line, leave_lost_marker
from pitstop.probe.hooks import Hooks
from pitstop.probe.kernels import kernel_facts
from pitstop.probe.rankfile import Kind, plain_step
from pitstop.probe.steps import ForwardWatch, StepTimeline
from pitstop.probe.stopping import WindowTracker
from pitstop.probe.stream import RankStream
from pitstop.probe.timeline import (
    StepBuilder,
)

PROGRESS_EVERY_S = 0.5
C = TypeVar("C", bound=Collector)


class CudaEventClock:
    """Marks are CUDA events on the model's device's current stream; read only once the device has passed
    them. The device is explicit: a model on ``cuda:1`` without ``set_device`` must not be timed on GPU
    0's idle stream (nor create a context there)."""

    def __init__(self, device: Any) -> None:
        import torch

        self._event = torch.cuda.Event
        self._stream = lambda: torch.cuda.current_stream(device)

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        event.record(self._stream())
        return event

    def ready(self, handle: Any) -> bool:
        return bool(handle.query())

    def wait(self, handle: Any) -> None:
        handle.synchronize()

    def seconds_between(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1000.0


class Probe:
    def __init__(
        self,
        config: ProbeConfig,
        on_done: Callable[[RankProfile], None] | None = None,
        trainer: Any = None,
    ) -> None:
        self.config = config
        self.on_done = on_done
        self.trainer_hint = trainer
        self.origin = time.perf_counter()
        self._pid = os.getpid()  # forked DataLoader workers inherit the probe; only this process reports
        self.hooks = Hooks(self)
        self.timeline = StepTimeline(self._close_step)
        self.records: list[StepRecord] = []
        self.step_listeners: list[Callable[[], None]] = []  # told after each optimizer step (live views)
        self.disable_listeners: list[Callable[[str], None]] = []  # told the error that disabled the probe
        self._measured = 0  # records past the warm-up, counted as they come (not recounted every step)
        self._stream = RankStream(config.out_dir) if config.out_dir is not None else None
        self.environment: Environment | None = None
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.errors: list[str] = []
        self.ctx = ProbeContext(
            config,
            self.origin,
            self.hooks,
            self.errors,
            self.disable,
            self._step_index,
            mark_generation=self.timeline.on_generate,
            watch_generation=self.timeline.watch_generation,
        )
        self.collectors: list[Collector] = [kind(self.ctx) for kind in COLLECTORS]
        self._step_ends = [c.step_end for c in self.collectors if overrides(c, "step_end")]
        self._streamers = [c.stream for c in self.collectors if overrides(c, "stream")]
        # the collectors the hooks' events go to
        self._attention = self._collector(AttentionCollector)
        self._autocast = self._collector(AutocastCollector)
        self._recompute = self._collector(RecomputeCollector)
        self._collate = self._collector(CollateCollector)
        self._syncs = self._collector(SyncCollector)
        self._collector(FailureCollector).attach(self._emit, self._failed_step)
        self.disabled = False
        self.finished = False
        self.window_start_t: float | None = None
        # ranks cannot agree on a window that each ends by its own steps without a collective of their
        # own: a job of several ranks measures the fixed window instead
        single = int(os.environ.get("WORLD_SIZE", "1") or 1) == 1
        self.tracker = WindowTracker(config.auto) if config.auto is not None and single else None
        self.window_reason: str | None = None
        self.window_end_t: float | None = None
        self._last_progress = 0.0
        self._lock = threading.Lock()

    @property
    def builder(self) -> StepBuilder:
        return self.timeline.builder

    @property
    def forward(self) -> ForwardWatch:
        return self.timeline.forward

    def _collector(self, kind: type[C]) -> C:
        return next(c for c in self.collectors if isinstance(c, kind))

    def _step_index(self) -> int:
        """The step under way (1-based): the builder's open step."""
        return self.builder.index + 1

    def _failed_step(self) -> int | None:
        """The step an uncaught exception ended: the one under way once it began (a batch, a forward), else
        the last one closed (a callback at a step's end raised); None before the first step."""
        began = bool(self.builder._open.marks)  # the open step's first event is a batch's or a forward's mark
        index = self.builder.index + (1 if began else 0)
        return index or None

    def _each(self, call: Callable[[Collector], None], what: str) -> None:
        """Call every collector; one that fails is noted and the others still run (stopping and removing
        must reach them all, on a path that must not raise into the job)."""
        for collector in self.collectors:
            try:
                call(collector)
            except Exception as exc:
                self.errors.append(f"{type(collector).__name__}.{what}: {type(exc).__name__}: {exc}")

    # -- lifecycle ------------------------------------------------------------------------------------
    def install(self) -> Probe:
        self.hooks.install()
        for collector in self.collectors:
            collector.install()
        if self.config.out_dir is not None:
            atexit.register(self._at_exit)
        return self

    def _emit(self, kind: str, **payload: Any) -> None:
        """One line to the rank file, when there is one; a failing write never reaches the run."""
        if self._stream is None:
            return
        try:
            self._stream.write(kind, **payload)
        except Exception as exc:  # one line lost; the next (the finished profile above all) may still go
            error = f"writing the rank file: {type(exc).__name__}: {exc}"
            if error not in self.errors:
                self.errors.append(error)

    def guard(self, fn: Callable[..., None], *args: Any) -> None:
        if self.disabled:
            return
        try:
            fn(*args)
        except Exception as exc:
            self.disable(exc)

    def disable(self, exc: BaseException) -> None:
        if self.disabled:
            return
        self.disabled = True
        self.errors.append(f"{type(exc).__name__}: {exc}")
        self._emit(Kind.ERROR, text=self.errors[-1])
        if self.config.out_dir is not None and os.getpid() == self._pid:  # no window will come:
            leave_lost_marker(self.config.out_dir, self.errors[-1])  # the runner ends the job
        self.hooks.remove()
        self._each(lambda c: c.remove(), "remove")
        self._each(lambda c: c.stop_window(), "stop_window")
        print(
            f"pitstop: probe disabled after an internal error ({type(exc).__name__}: {exc}); "
            "nothing more of this run is measured",
            file=sys.stderr,
        )
        for listener in self.disable_listeners:  # attach's arm: its window ends here, with this error
            with contextlib.suppress(Exception):  # a listener's failure never reaches the run
                listener(self.errors[-1])

    # -- listener callbacks: the step events go to the timeline, the rest to their collectors ------------
    def on_iterator(self, iterator: Any, loader: Any) -> None:
        self.timeline.on_iterator(iterator, loader)

    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None:
        self.timeline.on_batch(iterator, batch, wait_s)

    def on_backward(self, starting: bool) -> None:
        self.timeline.on_backward(starting)

    def on_optimizer(self, optimizer: Any, starting: bool) -> None:
        self.timeline.on_optimizer(optimizer, starting)

    def on_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.timeline.on_forward(module, args, kwargs)

    def on_collate(self, samples: Any, seconds: float) -> None:
        self._collate.on_collate(samples, seconds)

    def _close_step(self, kind: str, optimizer: Any) -> None:
        record = self.builder.end_step(kind)
        self.records.append(record)
        for step_end in self._step_ends:
            step_end(record)
        if record.index > self.config.warmup:
            self._measured += 1
        self._tell_listeners()
        self._after_step(record, optimizer)

    def _tell_listeners(self) -> None:
        """A listener that fails is dropped, never the measurement."""
        for listen in list(self.step_listeners):
            try:
                listen()
            except Exception:
                self.step_listeners.remove(listen)

    def on_sdpa(self, has_mask: bool) -> None:
        self._attention.on_sdpa(has_mask)

    def on_autocast(self, device_type: str, dtype: Any, enabled: bool) -> None:
        self._autocast.on_autocast(device_type, dtype, enabled)

    def on_checkpoint(self) -> None:
        self._recompute.on_checkpoint()

    def on_sync(self, seconds: float | None, kind: str, site: str) -> None:
        if not self.timeline.on_train_thread():
            return
        self.builder.sync(seconds)  # the step's own sync time; the sites are the collector's
        self._syncs.on_sync(seconds, kind, site)

    def on_copy(self, pinned: bool, non_blocking: bool) -> None:
        if self.timeline.on_train_thread():
            self._syncs.on_copy(pinned, non_blocking)

    # -- step bookkeeping -----------------------------------------------------------------------------
    def _after_step(self, record: StepRecord, optimizer: Any) -> None:
        index = record.index
        if index == 1:
            self.rank, self.local_rank = _ranks(self.rank, self.local_rank)  # Ray Train sets RANK late
            self._emit(
                Kind.START,
                rank=self.rank,
                local_rank=self.local_rank,
                pid=self._pid,
                warmup=self.config.warmup,
            )
            self._capture(optimizer)
        if self.tracker is not None:
            self._after_step_auto(record)
            return
        if index == self.config.warmup or (
            self.config.warmup == 0 and index == 1 and self.window_start_t is None
        ):
            self._start_window()
        self._stream_progress()
        self._progress(index)
        if self.config.steps is not None and self._measured >= self.config.steps:
            self.finish()

    def _after_step_auto(self, record: StepRecord) -> None:
        """The adaptive window: warm-up until the steps settle, then measure until the mean is precise."""
        tracker = self.tracker
        assert tracker is not None
        if tracker.warmup_steps is None:
            if tracker.warming(record.index, record.wall_s):
                self.config.warmup = record.index
                self._start_window()
        else:
            tracker.add(record.wall_s)
            if tracker.done():
                self.window_reason = tracker.reason()
                self.config.steps = tracker.n
        self._stream_progress()
        self._progress(record.index)
        if self.window_reason is not None:
            self.finish()

    def _stream_progress(self) -> None:
        """Append the steps whose timings are now known and the samplers' new readings to the rank file."""
        resolved = self.builder.take_resolved()
        if self._stream is None:
            return
        t = time.perf_counter() - self.origin
        for record in resolved:
            self._emit(Kind.STEP, step=plain_step(record), t=t)
        for stream in self._streamers:
            stream(self._emit)

    def measured_steps(self) -> list[StepRecord]:
        return [r for r in self.records if r.index > self.config.warmup]

    def _start_window(self) -> None:
        self.window_start_t = time.perf_counter() - self.origin
        self._emit(Kind.WINDOW, t=self.window_start_t)
        for collector in self.collectors:
            collector.start_window()

    def _capture(self, optimizer: Any) -> None:
        with warnings.catch_warnings():  # reading deprecated attributes must not print in the user's run
            warnings.simplefilter("ignore")
            self._capture_quietly(optimizer)

    def _capture_quietly(self, optimizer: Any) -> None:
        env = envmod.base_environment()
        framework, trainer = envmod.trainer_on_stack()
        if trainer is None and self.trainer_hint is not None:
            trainer = self.trainer_hint
            framework = envmod.framework_of(trainer) or framework
        env.framework = framework
        model = envmod.find_model(optimizer, trainer)
        if model is None:  # never `or`: a torch.compile'd module refuses bool()
            model = self.forward.root
        params = envmod.optimizer_params(optimizer) or [p for p in getattr(model, "parameters", list)()]
        device = envmod.compute_device(model, params)
        envmod.device_facts(device, env)
        env.gpus_held = envmod.gpus_held(model, params)
        env.model = envmod.model_info(model, optimizer)
        env.kernels = kernel_facts(optimizer, model, trainer)
        env.param_dtype = envmod.majority_dtype([p for p in params if p.requires_grad])
        env.attention = AttentionInfo(implementation=envmod.attention_implementation(model))
        env.gradient_checkpointing = envmod.gradient_checkpointing(model, trainer)
        env.dataloader = envmod.dataloader_info(self.timeline.train_loader())
        envmod.trainer_settings(trainer, env)
        envmod.run_length(trainer, env)
        env.save_steps = env.save_steps or trainer_save_steps(trainer)
        if env.micro_batch_size is None:
            env.micro_batch_size = env.dataloader.batch_size
        envmod.offload_and_zero(trainer, optimizer, env)
        self.rank, self.local_rank = envmod.world(env)
        if (env.world_size or 1) > 1:  # a group sized from Slurm's variables, not WORLD_SIZE, shows only now
            self.tracker = None  # its ranks cannot agree on an adaptive window either: the fixed one
        config = getattr(envmod.unwrap(model), "config", None)
        pad = getattr(config, "pad_token_id", None)
        eos = getattr(config, "eos_token_id", None)
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.timeline.pad_token_id = pad if isinstance(pad, int) and pad not in eos_ids else None
        self.environment = self.ctx.environment = env
        self.ctx.device, self.ctx.model = device, model
        if env.device == Device.CUDA:
            self.builder.switch_clock(CudaEventClock(device))
        for collector in self.collectors:  # samplers start, the sync watch and collective clocks switch on
            collector.begin()
        self._emit(Kind.ENVIRONMENT, environment=to_jsonable(env), rank=self.rank, local_rank=self.local_rank)
        self._announce(framework, env)

    def _announce(self, framework: str | None, env: Environment) -> None:
        if self.config.announce and self.rank == 0:
            window = "until the run ends" if self.config.steps is None else f"{self.config.steps} steps"
            plan = f"{self.config.warmup} warm-up steps, then measuring {window}"
            if self.tracker is not None:
                plan = (
                    "warming up until the steps settle, then measuring until the mean step time is known "
                    f"to ±{self.tracker.rule.precision:.0%}"
                )
            print(
                f"{fresh_line()}pitstop: observing a {framework} run on {env.gpu_name or env.device}: {plan}",
                file=sys.stderr,
            )

    def _progress(self, index: int) -> None:
        if self.config.out_dir is None or self.rank != 0:
            return
        now = time.perf_counter()
        if now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        payload = {"step": index, "warmup": self.config.warmup, "steps": self.config.steps}
        write_atomic(self.config.out_dir / "progress.json", json.dumps(payload))

    # -- finishing ------------------------------------------------------------------------------------
    def finish(self, reason: str = "window") -> RankProfile:
        """Close the window, hand the profile over, and (zero-code runner) end the process."""
        with self._lock:
            if self.finished:
                return self.rank_profile()
            self.finished = True
        self.window_end_t = time.perf_counter() - self.origin
        self.hooks.active = False
        try:
            self.builder.drain()
        except Exception as exc:
            self.errors.append(f"reading device timings: {exc}")
        self._each(lambda c: c.stop_window(), "stop_window")
        if reason == "window" and self.config.stop_when_done:
            self._each(lambda c: c.closing(), "closing")
        profile = self.rank_profile()
        profile.stopped_by_probe = reason == "window" and self.config.stop_when_done
        if self.config.out_dir is not None:
            self._write(profile)
            self.guard(gather.exchange, profile, self.config.out_dir)  # many nodes: to rank 0's node
        self.hooks.remove()
        self._each(lambda c: c.remove(), "remove")
        if self.on_done is not None:
            self.on_done(profile)
        if profile.stopped_by_probe:
            end_the_job(self.config.announce and self.rank == 0, len(profile.steps))
        return profile

    def rank_profile(self) -> RankProfile:
        """The rank's profile: the window's steps and the environment, each collector's figures filled in."""
        draft = assemble_rank(
            self.rank,
            self.environment or envmod.base_environment(),
            steps=self.records,
            warmup=self.config.warmup,
            local_rank=self.local_rank,
            pid=os.getpid(),
            window=(self.window_start_t, self.window_end_t),
            errors=self.errors,
        )
        sources = [self.builder.count_sources.get(s.index) for s in draft.steps]
        draft.tokens_counted_from = max(set(sources), key=sources.count) if sources else None
        draft.steps_delimited_by = self.forward.boundary
        draft.step_boundary_reason = self.forward.reason
        draft.window_rule = self.window_reason
        for collector in self.collectors:
            collector.fill(draft)
        return draft

    def _write(self, profile: RankProfile) -> None:
        """The finished profile closes the rank file (it supersedes the step lines before it)."""
        self._emit(Kind.PROFILE, profile=to_jsonable(profile))
        if self._stream is not None:
            self._stream.close()

    def _at_exit(self) -> None:
        """The run ended (or was interrupted) before the window closed: keep what was measured."""
        if self.finished or os.getpid() != self._pid:
            return
        if self.records or self.errors:
            self.config.stop_when_done = False
            self.finish(reason="exit")


def _ranks(rank: int, local_rank: int) -> tuple[int, int]:
    """RANK and LOCAL_RANK as the launcher has set them by now (read again at the first step: Ray Train sets
    them in a worker after torch was imported, when the probe was installed)."""
    try:
        return int(os.environ.get("RANK", rank)), int(os.environ.get("LOCAL_RANK", local_rank))
    except ValueError:
        return rank, local_rank
