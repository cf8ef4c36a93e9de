"""Many nodes: every rank's measurements reach the node that holds global rank 0, through the job's own store.

When a job spans nodes (torchrun ``--nnodes``, Slurm ``srun``, ``accelerate launch --num_machines``), each node
runs its own ``pitstop doctor``, which sees only its node's ranks; under ``srun pitstop doctor -- python
train.py`` each pitstop even sees only one rank. At the end of the window every rank puts its
RankProfile into the key-value store the job's ``torch.distributed`` already uses (its default group's
TCPStore, hosted by the launcher), and global rank 0 takes them out into its node's results folder. No extra
server, no shared filesystem, no collective (a collective would hang on a dead node): rank 0 polls the store
until every rank reported or a deadline passed, and names the ranks that did not. The other ranks wait (also
bounded) until rank 0 has read everything, so the launcher that hosts the store outlives the reading; rank 0
in turn waits (briefly) until they saw that, since under ``srun`` with ``env://`` rank 0's own process hosts it.

What is gathered is keyed by the pitstop that ran a rank (its host and results folder), not by the node: the
ranks of rank 0's own pitstop write their files themselves, every other rank's profile is written for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from pitstop.atomic import write_atomic
from pitstop.core.profile import RankProfile, to_jsonable
from pitstop.probe.config import ENV_RUNNER_PID
from pitstop.probe.rankfile import Kind, line

ENV_TIMEOUT = "PITSTOP_GATHER_TIMEOUT_S"
SUMMARY = "gather.json"  # rank 0's: what it gathered
SENT = "gather-sent.json"  # the other ranks': where rank 0 is (apart, so they never overwrite rank 0's)
PREFIX = "pitstop/"
POLL_S = 0.2
LEAVE_S = 10.0  # the most rank 0 waits for the others to see that it has read them
MAX_SENT_COLLECTIVES = 20_000  # per rank: 512 ranks × 20k records stay within what rank 0 can hold

_store: Any = None
_world: int | None = None  # the default group's size, read with the store


def job_world(environ: dict[str, str] | None = None) -> int | None:
    """The job's number of ranks as its launcher tells it: WORLD_SIZE, else Slurm's task count (a script
    started by ``srun`` may read SLURM_PROCID / SLURM_NTASKS itself)."""
    env = os.environ if environ is None else environ
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        text = env.get(name, "")
        if text.isdigit():
            return int(text)
    return None


def ranks_here(environ: dict[str, str] | None = None, parent: int | None = None) -> int | None:
    """How many of the job's ranks this process's pitstop ran: a rank pitstop started itself is its only one
    (``srun`` starts one pitstop per rank, whatever LOCAL_WORLD_SIZE a batch script exported); under torchrun
    and accelerate, whose ranks are pitstop's grandchildren, LOCAL_WORLD_SIZE says; else unknown."""
    env = os.environ if environ is None else environ
    runner = env.get(ENV_RUNNER_PID, "")
    if runner.isdigit() and int(runner) == (os.getppid() if parent is None else parent):
        return 1
    local = env.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isdigit() else None


def spans_nodes(environ: dict[str, str] | None = None, parent: int | None = None) -> bool:
    """Whether the job has ranks that another pitstop (on another node, or another ``srun`` task) runs."""
    world, here = job_world(environ), ranks_here(environ, parent)
    return world is not None and here is not None and here < world


def runner_of(out_dir: Path) -> str:
    """The pitstop that runs this rank, as the other ranks can tell it apart: its host and results folder."""
    return f"{socket.gethostname()}:{out_dir}"


def node_of(environ: dict[str, str] | None = None) -> str:
    """This node's name: host plus torchrun's node rank (two "nodes" may share a host in tests)."""
    env = os.environ if environ is None else environ
    group = env.get("GROUP_RANK") or env.get("SLURM_NODEID")
    host = socket.gethostname()
    return host if group is None else f"{host}#{group}"


def prepare() -> None:
    """Keep a handle on the job's store while the process group exists (the job may destroy it before the
    window ends), with the group's size (a script may have set it from Slurm's variables, not WORLD_SIZE)."""
    global _store, _world
    if _store is not None or not spans_nodes():
        return
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            _store = dist.distributed_c10d._get_default_store()
            _world = int(dist.get_world_size())
            if dist.get_rank() == 0:  # named now: a rank that finishes first learns where the report goes
                _store.set(f"{PREFIX}rank0_node", node_of())


def exchange(profile: RankProfile, out_dir: Path | None) -> None:
    """Publish this rank's profile; on global rank 0, gather everyone's into ``out_dir``."""
    if out_dir is None or not spans_nodes():
        return
    prepare()
    store = _store
    world = _world or job_world() or 1
    timeout = float(os.environ.get(ENV_TIMEOUT, "60"))
    node = node_of()
    if (
        store is None or world <= 1
    ):  # no process group to gather through (a 1-process script in an allocation)
        return
    sent = to_jsonable(profile)
    if len(sent["collectives"]) > MAX_SENT_COLLECTIVES:  # the latest steps are kept whole
        sent["collectives"] = sent["collectives"][-MAX_SENT_COLLECTIVES:]
    payload = json.dumps({"node": node, "runner": runner_of(out_dir), "profile": sent})
    store.set(f"{PREFIX}rank/{profile.rank}", payload)
    if profile.rank == 0:
        store.set(f"{PREFIX}rank0_node", node)
        reported = _collect(store, out_dir, world, node, timeout)
        store.set(f"{PREFIX}gathered", "1")
        _wait_all(store, [f"{PREFIX}left/{r}" for r in reported], min(timeout, LEAVE_S))
        return
    # written before any wait: a runner that stops the job while this rank waits still knows it sent
    sent_note = {"role": "sent", "node": node, "rank0_node": _get(store, f"{PREFIX}rank0_node", 0.0)}
    write_atomic(out_dir / SENT, json.dumps(sent_note | {"world_size": world}))
    if sent_note["rank0_node"] is None:
        sent_note["rank0_node"] = _get(store, f"{PREFIX}rank0_node", timeout)
        write_atomic(out_dir / SENT, json.dumps(sent_note | {"world_size": world}))
    if _get(store, f"{PREFIX}gathered", timeout) is not None:  # the store's host lives until rank 0 has read
        with contextlib.suppress(Exception):
            store.set(f"{PREFIX}left/{profile.rank}", "1")  # and rank 0 (maybe that host) until we saw it


def _get(store: Any, key: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while True:  # asked at least once (a timeout of 0 is one look)
        with contextlib.suppress(Exception):
            if store.check([key]):
                return bytes(store.get(key)).decode()
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def _wait_all(store: Any, keys: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while keys and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if store.check(keys):
                return
        time.sleep(POLL_S)


def _collect(store: Any, out_dir: Path, world: int, node: str, timeout: float) -> list[int]:
    """Rank 0: every other rank's profile into ``out_dir``, until all reported or ``timeout``; the ranks that
    reported."""
    waiting = set(range(1, world))
    nodes: dict[int, str] = {0: node}
    runner = runner_of(out_dir)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for rank in sorted(waiting):
            key = f"{PREFIX}rank/{rank}"
            try:
                if not store.check([key]):
                    continue
                data = json.loads(bytes(store.get(key)).decode())
            except Exception:
                continue
            waiting.discard(rank)
            nodes[rank] = data["node"]
            here = data["runner"] == runner if "runner" in data else data["node"] == node
            if not here:  # the ranks of rank 0's own pitstop write their files themselves
                # a rank file of the runner's form (the codec's, rankfile.py): one finished ``profile`` line
                finished = line(Kind.PROFILE, profile=data["profile"])
                write_atomic(out_dir / f"rank-remote-{rank:05d}.jsonl", finished)
        if waiting:
            time.sleep(POLL_S)
    missing = sorted(waiting)
    _summary(
        out_dir,
        {
            "role": "gathered",
            "node": node,
            "world_size": world,
            "nodes": {str(k): v for k, v in sorted(nodes.items())},
            "missing_ranks": missing,
            "missing_nodes": _guess_nodes(missing),
        },
    )
    return sorted(set(range(1, world)) - waiting)


def _guess_nodes(missing: list[int]) -> list[str]:
    """The nodes of ranks that never reported: torchrun numbers ranks node by node."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    local = int(text) if text.isdigit() else 0
    if not missing or local <= 0:
        return []
    return sorted({f"node {r // local}" for r in missing}, key=lambda s: int(s.split()[1]))


def _summary(out_dir: Path, doc: dict[str, Any]) -> None:
    write_atomic(out_dir / SUMMARY, json.dumps(doc))


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    """What the gathering left in a results folder: rank 0's, else the other ranks' (None: nothing gathered)."""
    for name in (SUMMARY, SENT):
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads((out_dir / name).read_text()))
    return None
