"""The per-process probe: listens at the hooks, keeps the step records, writes one RankProfile.

Lifecycle: installed (zero-code bootstrap, a callback or ``pitstop.watch``) → first optimizer step:
read the environment, start samplers → ``warmup`` steps → ``steps`` measured steps → finish: resolve
device timings, stop samplers, hand the RankProfile over (file and/or callback) → optionally end the
process (the zero-code runner's benchmark window). Any internal error disables the probe with one
warning; the training run goes on untouched.

A step ends at the optimizer's ``step()``. A job that never calls it once per step (the optimizer stepped
inside backward from per-parameter gradient hooks, or a hand-written update under ``torch.no_grad``) has its
steps closed instead at the next forward of the outermost training module once that module's parameters
have changed (their version counters, read on the host: no sync). Rows and tokens come from the DataLoader's
batches, or, where those carry none (a loop that builds its own batches), from that forward's inputs.

Under the runner every finished step (and the samplers' new readings) is appended to the rank file at
once (``probe.stream``), so a process killed by a signal still leaves what it measured.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pitstop.atomic import write_atomic
from pitstop.probe import collectives as collmod
from pitstop.probe import environment as envmod
from pitstop.probe.batch import count_batch, count_model_inputs
from pitstop.probe.collectors import COLLECTORS, Collector, ProbeContext, overrides
from pitstop.probe.collectors.attention import AttentionCollector
from pitstop.probe.collectors.autocast import AutocastCollector
from pitstop.probe.collectors.collate import CollateCollector
from pitstop.probe.collectors.recompute import RecomputeCollector
from pitstop.probe.collectors.syncs import SyncCollector
from pitstop.probe.config import ProbeConfig
from pitstop.probe.ending import end_the_job
from pitstop.probe.hooks import Hooks
from pitstop.probe.kernels import kernel_facts
from pitstop.probe.saves import trainer_save_steps
from pitstop.probe.stopping import WindowTracker
from pitstop.probe.stream import RankStream, plain_step, window_steps
from pitstop.probe.timeline import (
    BWD_END,
    BWD_START,
    DATA,
    FWD_BOUNDARY,
    FWD_START,
    OPT_END,
    OPT_START,
    BatchCounts,
    HostClock,
    StepBuilder,
)
from pitstop.profile import (
    AttentionInfo,
    CountSource,
    Environment,
    RankProfile,
    StepBoundary,
    StepRecord,
    to_jsonable,
)
from pitstop.vocabulary import Device

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
        self.builder = StepBuilder(HostClock())
        self.records: list[StepRecord] = []
        self.step_listeners: list[Callable[[], None]] = []  # told after each optimizer step (live views)
        self._measured = 0  # records past the warm-up, counted as they come (not recounted every step)
        self._stream = RankStream(config.out_dir) if config.out_dir is not None else None
        self.environment: Environment | None = None
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.errors: list[str] = []
        self.ctx = ProbeContext(config, self.origin, self.hooks, self.errors, self.disable, self._step_index)
        self.collectors: list[Collector] = [kind(self.ctx) for kind in COLLECTORS]
        self._step_ends = [c.step_end for c in self.collectors if overrides(c, "step_end")]
        self._streamers = [c.stream for c in self.collectors if overrides(c, "stream")]
        # the collectors the hooks' events go to
        self._attention = self._collector(AttentionCollector)
        self._autocast = self._collector(AutocastCollector)
        self._recompute = self._collector(RecomputeCollector)
        self._collate = self._collector(CollateCollector)
        self._syncs = self._collector(SyncCollector)
        self.disabled = False
        self.finished = False
        self.window_start_t: float | None = None
        # ranks cannot agree on a window that each ends by its own steps without a collective of their
        # own: a job of several ranks measures the fixed window instead
        single = int(os.environ.get("WORLD_SIZE", "1") or 1) == 1
        self.tracker = WindowTracker(config.auto) if config.auto is not None and single else None
        self.window_reason: str | None = None
        self.window_end_t: float | None = None
        self._primary: int | None = None
        self._train_thread: int | None = None
        self._bwd_depth = 0
        self._pending: list[tuple[int, BatchCounts]] = []  # (loader key, counts) not yet trained on
        self._train_loader_key: int | None = None
        self._loaders: dict[int, Any] = {}  # loader key -> weak reference to the DataLoader
        self._iter_loader: dict[int, int] = {}  # iterator id -> its loader's key
        self._grad_enabled: Callable[[], bool] | None = None
        self._pad_token_id: int | None = None
        self._last_progress = 0.0
        self._lock = threading.Lock()
        self.forward = ForwardWatch()

    def _collector(self, kind: type[C]) -> C:
        return next(c for c in self.collectors if isinstance(c, kind))

    def _step_index(self) -> int:
        """The step under way (1-based): the builder's open step."""
        return self.builder.index + 1

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
        self._emit("error", text=self.errors[-1])
        self.hooks.remove()
        self._each(lambda c: c.remove(), "remove")
        self._each(lambda c: c.stop_window(), "stop_window")
        print(
            f"pitstop: probe disabled after an internal error ({type(exc).__name__}: {exc}); "
            "your run continues unobserved",
            file=sys.stderr,
        )

    # -- listener callbacks ---------------------------------------------------------------------------
    def _on_train_thread(self) -> bool:
        ident = threading.get_ident()
        if self._train_thread is None:
            self._train_thread = ident
        return ident == self._train_thread

    def on_iterator(self, iterator: Any, loader: Any) -> None:
        """Batches are keyed by their DataLoader, not the iterator: a loop that calls ``iter(loader)`` each
        epoch trains on one loader through many iterators."""
        self._loaders[id(loader)] = weakref.ref(loader)
        self._iter_loader[id(iterator)] = id(loader)

    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None:
        if not self._on_train_thread() or self._evaluating():
            return
        self.builder.data_wait(wait_s)
        self.builder.mark(DATA)
        key = self._iter_loader.get(id(iterator), id(iterator))
        self._pending.append((key, count_batch(batch, self._pad_token_id)))

    def _evaluating(self) -> bool:
        """A batch taken for evaluation: under ``torch.no_grad`` / ``inference_mode``, or while the training
        model is in another mode than the one it trains in (``model.eval()``)."""
        if self._grad_enabled is None:
            import torch

            self._grad_enabled = torch.is_grad_enabled
        return not self._grad_enabled() or self.forward.evaluating()

    def on_collate(self, samples: Any, seconds: float) -> None:
        self._collate.on_collate(samples, seconds)

    def on_backward(self, starting: bool) -> None:
        if not self._on_train_thread():
            return  # reentrant checkpointing runs nested backward calls on autograd's threads
        if starting:
            self._bwd_depth += 1
            if self._bwd_depth == 1:
                self._commit_batch()
                self.builder.mark(BWD_START)
        else:
            self._bwd_depth = max(0, self._bwd_depth - 1)
            if self._bwd_depth == 0:
                self.builder.mark(BWD_END)

    def _commit_batch(self) -> None:
        """The oldest batch of the training loader not yet trained on is the one this backward belongs to
        (FIFO, so loaders that prefetch ahead and loops that take all of a step's micro-batches before the
        first forward still line up). The training loader is the one trained on before; while it has no batch
        waiting (the first step, a new loader), the loader the job fetched from last. Batches of other loaders
        (evaluation that slipped past ``_evaluating``) are dropped."""
        if not self._pending:
            return
        key = self._train_loader_key
        if all(k != key for k, _ in self._pending):
            key = self._train_loader_key = self._pending[-1][0]
        first = next(i for i, (k, _) in enumerate(self._pending) if k == key)
        counts = self._pending[first][1]
        self._pending = [(k, c) for k, c in self._pending[first + 1 :] if k == key]
        self.builder.batch(counts)

    def on_optimizer(self, optimizer: Any, starting: bool) -> None:
        watch = self.forward
        if self._bwd_depth > 0:  # stepped from a gradient hook (on autograd's thread, on a GPU)
            watch.in_backward = True
            watch.optimizer = watch.optimizer or optimizer
            return
        if not self._on_train_thread():
            return
        watch.inside_step = starting
        if watch.boundary is StepBoundary.MODEL_FORWARD:
            return
        if self._primary is None:
            self._primary = id(optimizer)
        if id(optimizer) != self._primary:
            return
        if starting:
            self.builder.mark(OPT_START)
            return
        watch.boundary = StepBoundary.OPTIMIZER_STEP
        self._close_step(OPT_END, optimizer)

    def on_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The outermost training forward: a step boundary where the optimizer gives none, and the counts
        of a batch the DataLoader did not hand over."""
        if self._bwd_depth or not self._on_train_thread():
            return
        watch = self.forward
        if module is not watch.root:
            watch.adopt(module)
        watch.note_mode()
        if watch.boundary is not StepBoundary.OPTIMIZER_STEP and watch.params_changed():
            if watch.boundary is None:
                watch.decide()
            self._close_step(FWD_BOUNDARY, watch.optimizer)
        if self._count_source is not CountSource.DATALOADER:
            # the loop built its batch itself: forward starts here, not where the previous step ended
            self.builder.mark(FWD_START)
            self.builder.model_batch(count_model_inputs(args, kwargs, watch.names, self._pad_token_id))

    @property
    def _count_source(self) -> CountSource | None:
        """Once a step's DataLoader batches carried tokens, the model's inputs are not counted any more."""
        sources = self.builder.count_sources
        return sources.get(self.builder.index) if sources else None

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
        if not self._on_train_thread():
            return
        self.builder.sync(seconds)  # the step's own sync time; the sites are the collector's
        self._syncs.on_sync(seconds, kind, site)

    def on_copy(self, pinned: bool, non_blocking: bool) -> None:
        if self._on_train_thread():
            self._syncs.on_copy(pinned, non_blocking)

    # -- step bookkeeping -----------------------------------------------------------------------------
    def _after_step(self, record: StepRecord, optimizer: Any) -> None:
        index = record.index
        if index == 1:
            self.rank, self.local_rank = _ranks(self.rank, self.local_rank)  # Ray Train sets RANK late
            self._emit(
                "start", rank=self.rank, local_rank=self.local_rank, pid=self._pid, warmup=self.config.warmup
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
            self._emit("step", step=plain_step(record), t=t)
        for stream in self._streamers:
            stream(self._emit)

    def measured_steps(self) -> list[StepRecord]:
        return [r for r in self.records if r.index > self.config.warmup]

    def _start_window(self) -> None:
        self.window_start_t = time.perf_counter() - self.origin
        self._emit("window", t=self.window_start_t)
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
        model = envmod.find_model(optimizer, trainer) or self.forward.root
        params = envmod.optimizer_params(optimizer) or [p for p in getattr(model, "parameters", list)()]
        device = envmod.compute_device(model, params)
        envmod.device_facts(device, env)
        env.model = envmod.model_info(model, optimizer)
        env.kernels = kernel_facts(optimizer, model, trainer)
        env.param_dtype = envmod.majority_dtype([p for p in params if p.requires_grad])
        env.attention = AttentionInfo(implementation=envmod.attention_implementation(model))
        env.gradient_checkpointing = envmod.gradient_checkpointing(model, trainer)
        env.dataloader = envmod.dataloader_info(self._train_loader())
        envmod.trainer_settings(trainer, env)
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
        self._pad_token_id = pad if isinstance(pad, int) and pad not in eos_ids else None
        self.environment = self.ctx.environment = env
        self.ctx.device, self.ctx.model = device, model
        if env.device == Device.CUDA:
            self.builder.switch_clock(CudaEventClock(device))
        for collector in self.collectors:  # samplers start, the sync watch and collective clocks switch on
            collector.begin()
        self._emit("environment", environment=to_jsonable(env), rank=self.rank, local_rank=self.local_rank)
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
                f"pitstop: observing a {framework} run on {env.gpu_name or env.device}: {plan}",
                file=sys.stderr,
            )

    def _train_loader(self) -> Any:
        key = self._train_loader_key
        ref = self._loaders.get(key) if key is not None else None
        return ref() if ref is not None else None

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
        profile = self.rank_profile()
        profile.stopped_by_probe = reason == "window" and self.config.stop_when_done
        if self.config.out_dir is not None:
            self._write(profile)
            self.guard(collmod.gather_to_rank0, profile, self.config.out_dir)
        self.hooks.remove()
        self._each(lambda c: c.remove(), "remove")
        if self.on_done is not None:
            self.on_done(profile)
        if profile.stopped_by_probe:
            end_the_job(self.config.announce and self.rank == 0, len(profile.steps))
        return profile

    def rank_profile(self) -> RankProfile:
        """The rank's profile: the window's steps and the environment, each collector's figures filled in."""
        env = self.environment or envmod.base_environment()
        steps, warmup = window_steps(self.records, self.config.warmup)
        sources = [self.builder.count_sources.get(s.index) for s in steps]
        draft = RankProfile(
            tokens_counted_from=max(set(sources), key=sources.count) if sources else None,
            steps_delimited_by=self.forward.boundary,
            step_boundary_reason=self.forward.reason,
            rank=self.rank,
            local_rank=self.local_rank,
            pid=os.getpid(),
            hostname=env.hostname,
            warmup_steps=warmup,
            steps=steps,
            window_start_t=self.window_start_t,
            window_end_t=self.window_end_t,
            window_rule=self.window_reason,
            environment=env,
            probe_errors=list(self.errors),
        )
        for collector in self.collectors:
            collector.fill(draft)
        return draft

    def _write(self, profile: RankProfile) -> None:
        """The finished profile closes the rank file (it supersedes the step lines before it)."""
        self._emit("profile", profile=to_jsonable(profile))
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


class ForwardWatch:
    """The outermost training module, its forward's parameter names, and the version counters of two of its
    trainable parameters (first and last): a change between two forwards without an optimizer step closing a
    step in between is an update the optimizer hooks did not see."""

    def __init__(self) -> None:
        self.root: Any = None
        self.names: tuple[str, ...] = ()
        self.boundary: StepBoundary | None = None
        self.reason: str | None = None
        self.in_backward = False  # an optimizer stepped inside backward (per-parameter gradient hooks)
        self.inside_step = False  # between an optimizer's step pre- and post-hook (a closure's forwards)
        self.optimizer: Any = None  # one optimizer stepped inside backward, to read its facts
        self._watched: list[Any] = []
        self._versions: tuple[int, ...] | None = None
        self._inner: Any = None  # the module inside DDP / FSDP / compile wrappers
        self._train_mode: bool | None = None  # the mode (``training``) its training forwards ran in

    def adopt(self, module: Any) -> None:
        import inspect

        self.root = module
        trainable = [p for p in module.parameters() if p.requires_grad]
        self._watched = [trainable[0], trainable[-1]] if trainable else []
        self._versions = None
        inner = module
        for _ in range(4):  # DDP / FSDP / compile wrappers forward *args to the module inside
            inner = getattr(inner, "module", None) or getattr(inner, "_orig_mod", None) or inner
        self._inner = inner
        self._train_mode = None
        try:
            params = inspect.signature(inner.forward).parameters.values()
            self.names = tuple(
                p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            )
        except (TypeError, ValueError):
            self.names = ()

    def _mode(self) -> bool:
        return bool(getattr(self.root, "training", True) and getattr(self._inner, "training", True))

    def note_mode(self) -> None:
        """At a training forward: the mode the model trains in (some jobs train in ``eval()`` mode)."""
        self._train_mode = self._mode()

    def evaluating(self) -> bool:
        """Whether the model is now in another mode than the one it trains in (``model.eval()``)."""
        return self._train_mode is not None and self._mode() != self._train_mode

    def params_changed(self) -> bool:
        """Whether the watched parameters changed since the previous forward (not inside an optimizer step:
        a closure's forwards belong to its step)."""
        if self.inside_step:
            return False
        versions = tuple(p._version for p in self._watched)
        before, self._versions = self._versions, versions
        return before is not None and versions != before

    def decide(self) -> None:
        self.boundary = StepBoundary.MODEL_FORWARD
        self.reason = (
            "the optimizer steps inside backward (per-parameter gradient hooks)"
            if self.in_backward
            else "the parameters change without an optimizer step (a hand-written update)"
        )
