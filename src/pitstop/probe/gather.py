"""Many nodes: every rank's measurements reach the node that holds global rank 0, through the job's own store.

When a job spans nodes (torchrun ``--nnodes``, Slurm ``srun``, ``accelerate launch --num_machines``), each node
runs its own ``pitstop doctor``, which sees only its node's ranks. At the end of the window every rank puts its
RankProfile into the key-value store the job's ``torch.distributed`` already uses (its default group's
TCPStore, hosted by the launcher), and global rank 0 takes them out into its node's results folder. No extra
server, no shared filesystem, no collective (a collective would hang on a dead node): rank 0 polls the store
until every rank reported or a deadline passed, and names the ranks that did not. The other ranks wait (also
bounded) until rank 0 has read everything, so the launcher that hosts the store outlives the reading.
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
from pitstop.profile import RankProfile, to_jsonable

ENV_TIMEOUT = "PITSTOP_GATHER_TIMEOUT_S"
SUMMARY = "gather.json"
PREFIX = "pitstop/"
POLL_S = 0.2
MAX_SENT_COLLECTIVES = 20_000  # per rank: 512 ranks × 20k records stay within what rank 0 can hold

_store: Any = None


def spans_nodes(environ: dict[str, str] | None = None) -> bool:
    """Whether the job has ranks on other nodes than this one (the launcher's variables say so)."""
    env = os.environ if environ is None else environ
    world, local = env.get("WORLD_SIZE", ""), env.get("LOCAL_WORLD_SIZE", "")
    return world.isdigit() and local.isdigit() and int(local) < int(world)


def node_of(environ: dict[str, str] | None = None) -> str:
    """This node's name: host plus torchrun's node rank (two "nodes" may share a host in tests)."""
    env = os.environ if environ is None else environ
    group = env.get("GROUP_RANK") or env.get("SLURM_NODEID")
    host = socket.gethostname()
    return host if group is None else f"{host}#{group}"


def prepare() -> None:
    """Keep a handle on the job's store while the process group exists (the job may destroy it before the
    window ends)."""
    global _store
    if _store is not None or not spans_nodes():
        return
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            _store = dist.distributed_c10d._get_default_store()


def exchange(profile: RankProfile, out_dir: Path | None) -> None:
    """Publish this rank's profile; on global rank 0, gather everyone's into ``out_dir``."""
    if out_dir is None or not spans_nodes():
        return
    prepare()
    store = _store
    world = int(os.environ["WORLD_SIZE"])
    timeout = float(os.environ.get(ENV_TIMEOUT, "60"))
    node = node_of()
    if store is None:
        _summary(out_dir, {"role": "unreachable", "node": node, "world_size": world})
        return
    sent = to_jsonable(profile)
    if len(sent["collectives"]) > MAX_SENT_COLLECTIVES:  # the latest steps are kept whole
        sent["collectives"] = sent["collectives"][-MAX_SENT_COLLECTIVES:]
    payload = json.dumps({"node": node, "profile": sent})
    store.set(f"{PREFIX}rank/{profile.rank}", payload)
    if profile.rank == 0:
        store.set(f"{PREFIX}rank0_node", node)
        _collect(store, out_dir, world, node, timeout)
        store.set(f"{PREFIX}gathered", "1")
        return
    rank0 = _get(store, f"{PREFIX}rank0_node", timeout)
    _summary(out_dir, {"role": "sent", "node": node, "rank0_node": rank0, "world_size": world})
    _get(store, f"{PREFIX}gathered", timeout)  # keep the store's host alive until rank 0 has read


def _get(store: Any, key: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if store.check([key]):
                return bytes(store.get(key)).decode()
        time.sleep(POLL_S)
    return None


def _collect(store: Any, out_dir: Path, world: int, node: str, timeout: float) -> None:
    waiting = set(range(1, world))
    nodes: dict[int, str] = {0: node}
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
            if data["node"] != node:  # this node's own ranks write their files themselves
                # a rank file of the runner's form (stream.py): one finished ``profile`` line
                line = json.dumps({"kind": "profile", "profile": data["profile"]})
                write_atomic(out_dir / f"rank-remote-{rank:05d}.jsonl", line + "\n")
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
    """What the gathering left in a results folder (None for single-node jobs)."""
    path = out_dir / SUMMARY
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
