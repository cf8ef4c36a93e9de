"""Kineto traces of a simulated data-parallel job, one per rank, with known clock offsets and a planted
straggler: what the cross-rank tests check pitstop against.

The job is simulated in one global time line. Every step, each rank loads a batch on the host, launches its
compute kernels, then an all-reduce; the all-reduce ends on every rank at the same moment, the last arrival
plus the transfer time, and the next step starts after it. A rank whose host is slower (``extra_host_us``)
or whose kernels are slower (``extra_kernel_us``) arrives late and every other rank's all-reduce kernel
waits for it. Each rank writes its events in its own clock: global time plus ``offsets[rank]``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

OLD_NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
NEW_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RCCL_GENERIC = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn"


def job(
    world: int,
    steps: int = 6,
    offsets: list[float] | None = None,
    straggler: int | None = None,
    extra_host_us: float = 0.0,
    extra_kernel_us: float = 0.0,
    kernels: int = 20,
    kernel_us: float = 400.0,
    loader_us: float = 1500.0,
    comm_us: float = 2000.0,
    nccl_names: dict[int, str] | None = None,
    padding_ops: int = 0,
) -> list[dict[str, Any]]:
    """One trace document per rank (rank order)."""
    offsets = offsets or [0.0] * world
    docs = []
    events: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    corr = [1000] * world
    t0 = 1_700_000_000_000_000.0
    step_start = t0
    for step in range(steps):
        arrivals = []
        plans = []
        for r in range(world):
            late_host = extra_host_us if r == straggler else 0.0
            late_gpu = extra_kernel_us / kernels if r == straggler else 0.0
            host = step_start + loader_us + late_host
            gpu_free = step_start
            launches = []
            for _ in range(kernels):
                start = max(gpu_free, host + 5.0)
                launches.append((host, start, kernel_us + late_gpu))
                gpu_free = start + kernel_us + late_gpu
                host += 8.0
            arrive = max(gpu_free, host + 5.0)
            arrivals.append(arrive)
            plans.append((launches, host, arrive, late_host))
        common_end = max(arrivals) + comm_us
        for r, (launches, host, arrive, late_host) in enumerate(plans):
            off = offsets[r]
            ev = events[r]
            name = (nccl_names or {}).get(r, NEW_NCCL)

            def add(e: dict[str, Any], off: float = off, ev: list[dict[str, Any]] = ev) -> None:
                e["ts"] = round(e["ts"] + off, 3)
                ev.append(e)

            add(
                _op(
                    "user_annotation", f"ProfilerStep#{step + 1}", step_start, common_end + 30 - step_start, 0
                )
            )
            add(
                _op(
                    "user_annotation",
                    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                    step_start,
                    loader_us + late_host,
                    1,
                )
            )
            for _ in range(padding_ops):
                add(_op("cpu_op", "aten::empty", step_start + 10, 1.0, 2))
            for host_t, start, dur in launches:
                corr[r] += 1
                add(runtime_event("cudaLaunchKernel", host_t, 5.0, corr[r]))
                add(kernel_event(GEMM, start, dur, corr[r], 7, {}))
            corr[r] += 1
            external = 900_000 + corr[r]
            add(_op("cpu_op", "nccl:all_reduce", host, 20.0, external))
            add(runtime_event("cudaLaunchKernel", host + 2, 5.0, corr[r]))
            comm_args = {
                "External id": external,
                "Collective name": "allreduce",
                "In msg nelems": 25_000_000,
                "Out msg nelems": 25_000_000,
                "Group size": world,
                "dtype": "Float",
                "Process Group Name": "0",
            }
            add(kernel_event(name, arrive, common_end - arrive, corr[r], 20, comm_args))
            add(runtime_event("cudaStreamSynchronize", host + 30, common_end - host - 30 + 10, -1))
        step_start = common_end + 50.0
    for r in range(world):
        docs.append(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
                "traceEvents": events[r],
            }
        )
    return docs


def _op(cat: str, name: str, ts: float, dur: float, external: int) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": {"External id": external},
    }


def runtime_event(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    """A runtime call as Kineto writes it (``cuda_runtime``, its correlation id)."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def kernel_event(  # a kernel on ``stream`` of device 0, correlated with the call that launched it
    name: str, ts: float, dur: float, corr: int, stream: int, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr, **extra},
    }


def write(doc: dict[str, Any], path: Path) -> Path:
    """Kineto's layout: the header keys, then one event per line."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    text = json.dumps(head)[:-1] + ', "traceEvents": [\n'
    text += ",\n".join(json.dumps(e) for e in doc["traceEvents"]) + "\n]}\n"
    data = text.encode()
    path.write_bytes(gzip.compress(data, 1) if path.suffix == ".gz" else data)
    return path


def write_folder(
    folder: Path, docs: list[dict[str, Any]], pattern: str = "rank-{rank}.pt.trace.json.gz"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, doc in enumerate(docs):
        write(doc, folder / pattern.format(rank=rank))
    return folder
