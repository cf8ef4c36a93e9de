"""Several artifacts of one run into one RunProfile: what ``pitstop analyze`` and ``pitstop check`` read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.artifacts import IngestError, read_text
from pitstop.core.profile import Environment, RankProfile, RunProfile, RunTotals, assemble_rank
from pitstop.core.vocabulary import Device, Source
from pitstop.hardware import lookup_gpu
from pitstop.ingest.configs import (
    ConfigFacts,
    checkpoint_quantization,
    merge_into,
    read_config,
    resolve_defaults,
)
from pitstop.ingest.dcgm import DcgmGpu, activity_ranks, attach_activity, read_dcgm
from pitstop.ingest.detect import expand, sniff
from pitstop.ingest.hf_outputs import read_trainer_outputs
from pitstop.ingest.logs import LogFacts, read_log
from pitstop.ingest.nvidia_smi import read_smi
from pitstop.ingest.topology import describe, merge_topology, read_nvlink_status, read_topo_matrix
from pitstop.plan.model_shape import ModelConfigError, load_model_config, model_info_from_config

CONFIG_KINDS = ("deepspeed", "accelerate", "axolotl", "llama_factory", "lightning", "hf_args")
MAX_WORLD = 1_000_000
NOT_ARTIFACTS = {
    "torch_pickle": "a pickle (training_args.bin, optimizer.pt?); pitstop never unpickles",
    "binary": "a binary file (weights, arrays)",
}


@dataclass
class Inputs:
    paths: list[Path]
    gpu: str | None = None
    gpus: int | None = None
    model: str | None = None
    configs_only: bool = False
    jobs: int | None = None  # trace reading: worker processes (None: from cores and free memory)
    dask: str | None = None  # trace reading on a Dask cluster: "local" or a scheduler address
    kinds: dict[str, str] = field(default_factory=dict)  # file -> kind, for the report


def _merge_totals(a: RunTotals | None, b: RunTotals) -> RunTotals:
    if a is None:
        return b
    for key, value in vars(b).items():
        if value is not None and getattr(a, key) is None:
            setattr(a, key, value)
    return a


def _refuse(path: Path, kind: str, configs_only: bool) -> None:
    """Files that are named explicitly but that pitstop will not read (or not in `pitstop check`): one clear
    error instead of a skip."""
    if configs_only and kind not in (*CONFIG_KINDS, "model_config"):
        raise IngestError(f"{path}: a {kind.replace('_', ' ')}, not a config; `pitstop analyze` reads it")
    if kind == "torch_pickle":
        raise IngestError(
            f"{path}: a pickled file (training_args.bin?); pitstop never unpickles. Export the arguments "
            "instead: python -c \"import torch,json; a=torch.load('training_args.bin', weights_only=False); "
            'print(a.to_json_string())" > training_args.json'
        )
    if kind == "binary":
        raise IngestError(f"{path}: {NOT_ARTIFACTS[kind]}, not an artifact pitstop reads")


def _apply_flags(inputs: Inputs, env: Environment, totals: RunTotals | None) -> RunTotals | None:
    """--model, --gpu and --gpus: what the user states over what the artifacts said."""
    if inputs.model:
        try:
            env.model = model_info_from_config(load_model_config(inputs.model))
        except ModelConfigError as exc:
            raise IngestError(str(exc)) from None
    if inputs.gpu:
        spec = lookup_gpu(inputs.gpu)
        if spec is None:
            raise IngestError(f"--gpu {inputs.gpu}: not in pitstop's hardware table (see `pitstop gpus`)")
        env.gpu_name = spec.key
        env.device = Device.CUDA
    if inputs.gpus is not None and not 1 <= inputs.gpus <= MAX_WORLD:
        raise IngestError(f"--gpus {inputs.gpus}: not a GPU count (1 to {MAX_WORLD:,})")
    if inputs.gpus:
        env.world_size = inputs.gpus
        totals = _merge_totals(totals, RunTotals(n_gpus=inputs.gpus)) if totals is not None else None
    return totals


def _join_ranks(
    trace_ranks: list[RankProfile], gpu_ranks: list[RankProfile], env: Environment, notes: list[str]
) -> list[RankProfile]:
    """The ranks come from traces, else from nvidia-smi's GPUs; nvidia-smi's samples join the traced ranks in order,
    and each rank's own environment and the run's complete each other."""
    ranks = trace_ranks or gpu_ranks
    if trace_ranks and gpu_ranks:
        for trace_rank, gpu_rank in zip(trace_ranks, gpu_ranks, strict=False):
            trace_rank.gpu_samples = gpu_rank.gpu_samples
    for rank in ranks:  # what the artifacts themselves measured wins over configs
        merge_into(rank.environment, env, [])
    if ranks:
        merge_into(env, ranks[0].environment, notes)
        env.world_size = env.world_size or len(ranks)
    return ranks


def _smi_ranks(path: Path, notes: list[str]) -> list[RankProfile]:
    """A rank per GPU of an nvidia-smi log, its samples and name."""
    log = read_smi(path)
    notes += log.notes
    ranks = []
    for i, gpu in enumerate(log.gpus):
        env = Environment(device=Device.CUDA, gpu_name=gpu.name, gpu_count=len(log.gpus))
        ranks.append(assemble_rank(i, env, gpu_samples=gpu.samples))
    return ranks


def _config(
    path: Path, kind: str, data: Any, files: list[Path], env: Environment, notes: list[str]
) -> ConfigFacts:
    """A training config's facts, merged into the run's."""
    facts = read_config(data, kind, path, others=files)
    merge_into(env, facts.env, notes)
    notes += facts.notes
    if facts.lora and env.model.params_total:
        notes.append("LoRA: trainable parameters are a small share; FLOPs count frozen weights at 4·N")
    return facts


def _log_ranks(ranks: list[RankProfile], logs: list[LogFacts], env: Environment) -> list[RankProfile]:
    """Each process's facts from the logs onto its rank: by rank number among the ranks the other artifacts
    made, and, where they made none, on a rank of its own (no steps: a log times nothing). A launcher's
    prefixes ("[rank7]:") name that many processes at least."""
    seen = max((log.processes or 0 for log in logs), default=0)
    if env.world_size is None and seen > 1:
        env.world_size = seen
    if not logs:
        return ranks
    numbers = sorted({r for log in logs for r in log.ranks})
    if not ranks:
        ranks = [assemble_rank(r) for r in numbers]
    by_number = {rank.rank: rank for rank in ranks}
    for log in logs:
        for number, ddp in log.ddp.items():
            target = by_number.get(number)
            if target is not None and target.ddp is None:
                target.ddp = ddp
        for number, stats in log.compile.items():
            target = by_number.get(number)
            if target is not None and target.compile is None:
                target.compile = stats
    return ranks


def _log_or_links(path: Path, kind: str, env: Environment, notes: list[str], logs: list[LogFacts]) -> None:
    """A run's log (NCCL's init lines read wherever they stand) or nvidia-smi's ``topo -m`` / ``nvlink -s``
    printout: the log's facts into the run's, the links into ``env.links`` (each source adding to the others)."""
    if kind in ("training_log", "nccl_log"):
        logs.append(log := read_log(path))
        merge_into(env, log.env, notes)
        notes += log.notes
        links = log.env.links
    else:
        links = (read_topo_matrix if kind == "nvidia_smi_topo" else read_nvlink_status)(read_text(path))
    env.links = merge_topology(env.links, links)


def load_run(
    inputs: Inputs,
    on_file: Callable[[Path, str], None] | None = None,
    on_trace: Callable[[int, int, str], None] | None = None,
) -> RunProfile:
    notes: list[str] = []
    found = expand(inputs.paths, notes)
    files = [path for path, _ in found]
    env = Environment()
    trace_ranks: list[RankProfile] = []
    trace_paths: list[Path] = []
    trace_notes: list[str] = []
    gpu_ranks: list[RankProfile] = []
    activity: list[DcgmGpu] = []
    totals: RunTotals | None = None
    configs: list[ConfigFacts] = []
    logs: list[LogFacts] = []
    for path, in_folder in found:
        try:
            kind, data, doc_notes = sniff(path)
        except IngestError as exc:
            if not in_folder:
                raise
            notes.append(f"skipped {path.name} ({str(exc).removeprefix(str(path) + ': ')})")
            continue
        if kind in NOT_ARTIFACTS and in_folder:  # a checkpoint folder holds these beside trainer_state.json
            notes.append(f"skipped {path.name} ({NOT_ARTIFACTS[kind]})")
            continue
        notes += doc_notes
        inputs.kinds[str(path)] = kind
        if on_file is not None:
            on_file(path, kind)
        _refuse(path, kind, inputs.configs_only)
        if kind == "kineto_trace":
            trace_paths.append(path)
        elif kind == "nvidia_smi":
            gpu_ranks += _smi_ranks(path, notes)
            env.gpu_count = env.gpu_count or len(gpu_ranks)
        elif kind in ("dcgmi_dmon", "dcgm_exporter", "dcgm_csv"):
            dcgm = read_dcgm(path, kind)
            notes += dcgm.notes
            activity += dcgm.gpus
        elif kind in ("trainer_state", "trainer_results"):
            outputs = read_trainer_outputs(data, path.name)
            totals = _merge_totals(totals, outputs.totals)
            merge_into(env, outputs.env, notes)
            notes += outputs.notes
        elif kind == "model_config":
            try:
                env.model = model_info_from_config(data)
            except ModelConfigError as exc:
                raise IngestError(f"{path}: {exc}") from None
            env.quantized_base = checkpoint_quantization(data, path.name)
        elif kind in CONFIG_KINDS:
            configs.append(_config(path, kind, data, files, env, notes))
        elif kind in ("training_log", "nccl_log", "nvidia_smi_topo", "nvidia_smi_nvlink"):
            _log_or_links(path, kind, env, notes, logs)
        else:  # pragma: no cover - sniff returns only the kinds above
            raise IngestError(f"{path}: unsupported kind {kind}")
    if trace_paths:  # all traces at once: in parallel, then the cross-rank step
        from pitstop.trace.fleet import read_traces

        fleet = read_traces(trace_paths, jobs=inputs.jobs, dask=inputs.dask, progress=on_trace)
        trace_ranks, trace_notes = fleet.ranks, fleet.notes
    totals = _apply_flags(inputs, env, totals)
    ranks = _join_ranks(trace_ranks, gpu_ranks or activity_ranks(activity), env, notes)
    ranks = _log_ranks(ranks, logs, env)
    attach_activity(ranks, activity, notes)
    resolve_defaults(env, configs, notes)
    notes += [describe(env.links, env.gpu_name)] if env.links is not None else []
    profile = RunProfile(
        source=Source.ANALYZE if not inputs.configs_only else Source.CHECK,
        ranks=ranks,
        totals=totals,
        run_environment=env,
        notes=notes,
    )
    profile.command = [str(p) for p in inputs.paths]
    profile.notes += trace_notes
    return profile
