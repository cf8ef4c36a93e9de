"""A JobView -> the RunProfile the rules read. Per-step records come from the samples between step starts
(each time is samples × the sampling interval); what samples cannot know (tokens, padding, the model, the
dtype) stays None, unless a trainer_state.json in the job's folder says it; the attention path and padding
without packing are set where the stacks show them (``evidence.py``)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

from pitstop.attach import procs
from pitstop.attach.classify import Phase
from pitstop.attach.evidence import RankEvidence, Sources, env_settings, rank_evidence, with_log
from pitstop.attach.view import JobView, RankView
from pitstop.core.profile import (
    CpuThreads,
    Environment,
    HostSample,
    RankProfile,
    RunProfile,
    RunTotals,
    SaveStats,
    StepBoundary,
    StepRecord,
    assemble_rank,
)
from pitstop.core.vocabulary import Device, Source


def build_profile(view: JobView, started_at: str | None = None) -> RunProfile:
    profile = RunProfile(source=Source.ATTACH, started_at=started_at)
    profile.command = procs.cmdline(view.window.pid) or None
    for rank in view.ranks:
        profile.ranks.append(_rank_profile(rank, view))
    profile.notes += _job_logs(view, profile.ranks)
    profile.totals = _sampled_totals(view.ranks)
    state = _trainer_state(view)
    if state is not None:
        profile.totals, notes = state
        profile.notes += notes
    return profile


def _job_logs(view: JobView, ranks: list[RankProfile]) -> list[str]:
    """The job's own log, where its processes write stdout / stderr to a file: what the libraries printed
    (DDP's unused-parameter warning, dynamo's recompile limit, anomaly mode's warning) completes what the
    samples show. A log with launcher prefixes (``[rank1]:``) is read per rank; one without, for each rank
    that writes to it."""
    from pitstop.artifacts import IngestError
    from pitstop.ingest.logs import LogFacts, read_log

    writers: dict[Path, list[int]] = {}
    for rank in view.ranks:
        for path in procs.output_files(rank.pid):
            writers.setdefault(path, []).append(rank.pid)
    for path in procs.output_files(view.window.pid):  # the launcher's: its ranks' lines, prefixed
        writers.setdefault(path, [])
    notes: list[str] = []
    logs: list[tuple[Path, LogFacts]] = []
    for path in writers:
        try:
            logs.append((path, read_log(path)))
        except IngestError as exc:
            notes.append(f"the job's output {path} was not read ({exc})")
    for path, log in logs:
        notes.append(
            f"read the job's output {path} ({log.lines:,} lines)"
            + (f": {'; '.join(log.notes)}" if log.notes else "")
        )
        for prof in ranks:
            if log.processes is not None:
                number = prof.rank
            elif prof.pid in writers[path] or not writers[path]:
                number = 0  # no prefixes: the lines are of the processes that write the file
            else:
                continue
            prof.ddp, prof.compile = with_log(
                prof.ddp,
                prof.compile,
                log.ddp.get(number),
                log.compile.get(number),
                f"the job's output {path.name}",
            )
            if log.env.anomaly_detection:
                prof.environment.anomaly_detection = True
    return notes


def _count(phases: Sequence[Phase], phase: Phase) -> int:
    return sum(1 for p in phases if p is phase)


def steps_of(rank: RankView) -> list[StepRecord]:
    """One StepRecord per counted step; the whole window as one record when no two step starts were seen."""
    dt = rank.main.interval_s
    starts = rank.steps.starts
    bounds = list(itertools.pairwise(starts)) or [(0, len(rank.phases))]
    out = []
    for index, (a, b) in enumerate(bounds):
        seg = rank.phases[a:b]
        out.append(
            StepRecord(
                index=index,
                wall_s=len(seg) * dt,
                data_wait_s=_count(seg, Phase.DATA) * dt,
                forward_s=_count(seg, Phase.FORWARD) * dt,
                backward_s=_count(seg, Phase.BACKWARD) * dt,
                optimizer_s=_count(seg, Phase.OPTIMIZER) * dt,
                collective_blocked_s=_count(seg, Phase.COLLECTIVE) * dt,
            )
        )
    return out


def _saves(rank: RankView, steps: int) -> SaveStats:
    phases = rank.phases
    entries = [
        i for i, p in enumerate(phases) if p is Phase.SAVE and (i == 0 or phases[i - 1] is not Phase.SAVE)
    ]
    saved = _count(phases, Phase.SAVE)
    return SaveStats(
        saves=len(entries), save_s=saved * rank.main.interval_s, steps_with_saves=min(len(entries), steps)
    )


def _rank_profile(rank: RankView, view: JobView) -> RankProfile:
    steps = steps_of(rank)
    env = _environment(rank, view)
    gpu = view.window.gpu
    index = gpu.of_pid.get(rank.pid)
    if index is not None:
        env.gpu_name = gpu.names.get(index)
    host = []
    if rank.cpu_pct is not None:
        host = [
            HostSample(
                t=0.0,
                main_cpu_pct=rank.cpu_pct,
                workers_cpu_pct=rank.workers_cpu_pct or 0.0,
                workers=len(rank.workers),
            )
        ]
    errors = []
    if not rank.steps.resolved:
        errors.append(
            f"steps are shorter than the sampling resolves ({rank.steps.method} seen {rank.steps.steps} times): "
            "the step count is a lower bound and per-step times are upper bounds; the shares stand"
        )
    if len(steps) == 1 and rank.steps.steps < 1:
        errors.append("no two step starts were sampled: the window is one record, not steps")
    profile = assemble_rank(
        rank.rank,
        env,
        steps=steps,
        local_rank=rank.local_rank,
        pid=rank.pid,
        gpu_samples=gpu.samples.get(index, []) if index is not None else [],
        host_samples=host,
        window=(0.0, rank.main.seconds),
        errors=errors,
    )
    profile.checkpoints = _saves(rank, len(steps))
    evidence = rank_evidence(
        rank.main.stacks,
        rank.steps.starts,
        rank.main.interval_s,
        [p in (Phase.FORWARD, Phase.BACKWARD) for p in rank.phases],
        len(steps),
        env_settings(procs.environ, rank.pid),
        Sources(rank.pid),
    )
    profile.job_calls = evidence.job_calls
    profile.compile = evidence.compile
    profile.debug_modes = evidence.debug_modes
    profile.ddp = evidence.ddp
    _seen_settings(profile.environment, evidence)
    profile.steps_delimited_by = StepBoundary.OPTIMIZER_STEP
    # "sampled: " marks a sampled rank for the report's counting line (diagnose.counting_line)
    bound = "" if rank.steps.resolved else ", a lower bound"
    profile.step_boundary_reason = f"sampled: {rank.steps.method}{bound}"
    return profile


def _seen_settings(env: Environment, evidence: RankEvidence) -> None:
    """What the samples show of the settings the rules read from the environment: the eager attention path
    (a transformers model when its ``eager_attention_forward`` ran, so the fix is a loading argument), and
    batches padded without packing (the collate, ``padding="max_length"`` in the job's code). The pad share
    stays unknown: tokens are in no stack."""
    if evidence.attention is not None:
        env.attention = evidence.attention
        if evidence.attention_library is not None:
            env.model.library = evidence.attention_library
    padding = evidence.padding
    if padding is None:
        return
    if env.packing is None and env.framework != "trl":
        env.packing = False  # TRL's collator may pack; transformers' collators and max_length padding do not
    env.dataloader.collate_fn = env.dataloader.collate_fn or padding.collate
    if padding.max_length_lines:  # as the probe's tokenizer watch names the call (probe/collectors)
        loader = env.dataloader
        loader.tokenizer_padding_site, loader.tokenizer_padding_code = padding.max_length_lines[0]
        loader.tokenizer_pads_to = padding.pads_to


def _environment(rank: RankView, view: JobView) -> Environment:
    env = Environment(framework=rank.framework, cpu_count=os.cpu_count(), hostname=os.uname().nodename)
    env.device = Device.CUDA if rank.gpus or rank.pid in view.window.gpu.of_pid else Device.CPU
    env.gpu_count = len(set(view.window.gpu.of_pid.values())) or len(rank.gpus) or None
    env.gpus_held = view.window.gpu.held.get(rank.pid)
    env.world_size = _world_size(rank, view)
    if rank.loader == "single":
        env.dataloader.num_workers = 0
    elif rank.loader == "multi" and rank.workers:
        env.dataloader.num_workers = len(rank.workers)
    runnable = [r.runnable for r in view.ranks if r.runnable is not None]
    env.cpu = CpuThreads(
        cores_allowed=rank.cores_allowed,
        machine_cores=os.cpu_count(),
        local_ranks=len(view.ranks),
        launcher=view.launcher,
        runnable_threads=sum(runnable) if runnable else None,
    )
    return env


def _world_size(rank: RankView, view: JobView) -> int:
    value = procs.environ(rank.pid, "WORLD_SIZE").get("WORLD_SIZE")
    return int(value) if value and value.isdigit() else len(view.ranks)


def _sampled_totals(ranks: list[RankView]) -> RunTotals | None:
    """Evaluation's share as the samples show it (the eval rule reads eval_s over train_s)."""
    if not ranks or not any(r.shares[Phase.EVAL].hits for r in ranks):
        return None  # no evaluation seen: the share is not known to be 0 over the run, only in the window
    rank = max(ranks, key=lambda r: r.shares[Phase.EVAL].hits)
    evals = [
        i
        for i, p in enumerate(rank.phases)
        if p is Phase.EVAL and (i == 0 or rank.phases[i - 1] is not Phase.EVAL)
    ]
    return RunTotals(
        train_s=rank.main.seconds,
        eval_s=_count(rank.phases, Phase.EVAL) * rank.main.interval_s,
        evals=len(evals) or None,
    )


def find_trainer_state(folder: Path) -> Path | None:
    """The job's newest trainer_state.json: in its folder, an output folder below it, or the newest
    checkpoint folder of one (a Trainer writes it with each checkpoint)."""
    found: list[Path] = []
    for pattern in ("trainer_state.json", "*/trainer_state.json", "*/checkpoint-*/trainer_state.json"):
        try:
            found += [p for p in folder.glob(pattern) if p.is_file()]
        except OSError:
            continue
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def _trainer_state(view: JobView) -> tuple[RunTotals, list[str]] | None:
    import json

    from pitstop.artifacts import read_text
    from pitstop.ingest.hf_outputs import is_trainer_state, read_trainer_outputs

    pids = [r.pid for r in view.ranks] + [view.window.pid]
    folder = next((c for c in map(procs.cwd, pids) if c is not None), None)
    path = None if folder is None else find_trainer_state(folder)
    if path is None:
        return None
    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError, Exception):  # an unreadable or half-written file is a note, not a failure
        return None
    if not is_trainer_state(data):
        return None
    outputs = read_trainer_outputs(data, path.name)
    return outputs.totals, [f"read {path}", *outputs.notes]
