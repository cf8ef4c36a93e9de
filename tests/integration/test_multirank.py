"""Many ranks for real: 2-rank gloo DDP jobs under `pitstop doctor -- torchrun`, with one planted cause each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor, run_pitstop

pytestmark = pytest.mark.slow

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
SCRIPT = str(SCRIPTS / "ddp_ranks.py")


@pytest.mark.smoke
def test_slow_compute_rank_is_the_straggler_and_the_other_waits(tmp_path: Path) -> None:
    doc, proc = doctor(
        tmp_path, *TORCHRUN, SCRIPT, "--slow-compute-rank", "1", "--slow-compute-ms", "200", steps=10
    )
    straggler = next(f for f in doc["findings"] if f["cause"] == "straggler")
    ev = straggler["evidence"]
    assert ev["slow_rank"] == 1 and ev["reason"] == "compute" and ev["persistent"]
    assert ev["arrived_last_frac"] > 0.8
    assert straggler["severity"] == "high"
    ranks = {r["rank"]: r for r in doc["ranks"]}
    # rank 0 waits for rank 1 about the planted 200 ms a step; rank 1 itself hardly waits. Relative to the plant,
    # not to the step: on a busy machine rank 0's own compute grows and its share of waiting shrinks (CI once
    # saw 70 ms of 184 with an 80 ms plant)
    assert ranks[0]["wait_s"] > 0.1
    assert ranks[0]["wait_s"] > 3 * ranks[1]["wait_s"]
    assert ranks[1]["own_compute_s"] > ranks[0]["own_compute_s"] + 0.1
    assert doc["communication"]["straggler"] == 1
    assert "Rank 1 arrives last" in proc.stdout


def test_communication_heavy_job_is_communication_bound_first(tmp_path: Path) -> None:
    doc, _ = doctor(tmp_path, *TORCHRUN, SCRIPT, "--heavy", steps=8)
    assert causes(doc)[0] == "communication_bound"
    ev = doc["findings"][0]["evidence"]
    allreduce = ev["bandwidth"]["all_reduce"]
    assert allreduce["mb_per_step"] == pytest.approx(6 * 2048 * 2048 * 4 / 1e6, rel=0.01)
    assert allreduce["busbw_gbps"] > 0 and allreduce["busbw_gbps"] == allreduce["algbw_gbps"]  # 2(n-1)/n = 1
    assert ev["exposed_frac_of_step"] >= 0.1
    assert ev["backend"] == "gloo"
    assert doc["metrics"]["scaling_efficiency"] is not None and doc["metrics"]["scaling_efficiency"] < 1.0


def test_healthy_two_rank_job_has_no_high_finding(tmp_path: Path) -> None:
    # batch 16: enough compute per step that gloo's all-reduce of 0.6 MB stays a small share of it, whether the
    # machine is idle (40 ms steps at batch 4) or loaded. 30 steps: on a busy machine one rank or the other
    # is descheduled and arrives late; a straggler is HIGH only when the same rank is last in 3 steps of 4,
    # which chance gave in 10 steps (once in four runs beside two busy processes) but hardly ever in 30
    doc, _ = doctor(tmp_path, *TORCHRUN, SCRIPT, "--batch", "16", steps=30)
    assert not [f["cause"] for f in doc["findings"] if f["severity"] == "high"], doc["findings"]
    # per step: DDP's buffer broadcast at the forward's start and one gradient bucket, matched on both ranks
    assert doc["communication"]["matched_collectives"] == 60
    assert all(r["collectives_per_step"] == 2.0 for r in doc["ranks"])
    assert {b["op"] for b in doc["communication"]["bandwidth"]} == {"all_reduce", "broadcast"}


def test_losses_are_bit_identical_with_and_without_the_probe(tmp_path: Path) -> None:
    plain, probed = tmp_path / "plain", tmp_path / "probed"
    subprocess.run(
        [*TORCHRUN, SCRIPT, "--steps", "12", "--losses", str(plain)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    proc = run_pitstop(
        "doctor",
        "--quiet",
        "--full",
        "--warmup",
        "2",
        "--",
        *TORCHRUN,
        SCRIPT,
        "--steps",
        "12",
        "--losses",
        str(probed),
    )
    assert proc.returncode == 0, proc.stderr
    assert "collective" not in proc.stderr  # the probe was not disabled
    for rank in (0, 1):
        a = Path(f"{plain}.rank{rank}").read_text().split("\n")
        b = Path(f"{probed}.rank{rank}").read_text().split("\n")
        assert len(a) == 13 and a == b


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _together(
    tmp_path: Path,
    commands: list[list[str]],
    envs: list[dict[str, str]] | None = None,
    window: tuple[str, ...] = ("--warmup", "3", "--steps", "8"),
) -> list[tuple[subprocess.CompletedProcess[str], Path]]:
    """One `pitstop doctor --json nodeI.json -- COMMAND_i` per command, all started at once (one per "node")."""
    import os

    from tests.conftest import ROOT

    procs = []
    for node, command in enumerate(commands):
        out = tmp_path / f"node{node}.json"
        cmd = [sys.executable, "-m", "pitstop", "doctor", "--quiet", *window]
        env = {**os.environ, "PITSTOP_GATHER_TIMEOUT_S": "15", "COLUMNS": "120"}
        env.update(envs[node] if envs else {})
        popen = subprocess.Popen(
            [*cmd, "--json", str(out), "--", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        procs.append((popen, out))
    done = []
    for popen, out in procs:
        stdout, stderr = popen.communicate(timeout=300)
        done.append((subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr), out))
    return done


def _two_nodes(tmp_path: Path, *script_args: str) -> list[tuple[subprocess.CompletedProcess[str], Path]]:
    """Two `pitstop doctor -- torchrun --nnodes 2 --node-rank i` started together, one rank per "node"."""
    port = _free_port()
    commands = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        cmd += ["--nproc_per_node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", SCRIPT, *script_args]
        commands.append(cmd)
    return _together(tmp_path, commands)


def test_two_nodes_give_one_report_on_the_node_of_rank_0(tmp_path: Path) -> None:
    import json

    (node0, out0), (node1, out1) = _two_nodes(tmp_path)
    assert node0.returncode == 0, node0.stderr
    doc = json.loads(out0.read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["steps"] == 8 for r in doc["ranks"])
    assert doc["communication"]["matched_collectives"] == 16  # buffer broadcast + gradient bucket per step
    assert not doc["missing_ranks"]
    assert "the job's report is on" in node1.stderr and "#0" in node1.stderr
    assert not out1.exists()


def test_a_node_that_dies_mid_window_is_named_missing(tmp_path: Path) -> None:
    import json

    (node0, out0), _ = _two_nodes(tmp_path, "--die-rank", "1", "--die-step", "7")
    doc = json.loads(out0.read_text())
    assert doc["missing_ranks"] == [1] and doc["missing_hosts"] == ["node 1"]
    assert [r["rank"] for r in doc["ranks"]] == [0] and doc["ranks"][0]["steps"] >= 2
    assert any("ranks 1 (node 1) did not report" in n for n in doc["notes"])
    assert node0.returncode != 0  # the job failed, and pitstop says so


def test_scaling_efficiency_against_a_one_rank_run_from_the_history(tmp_path: Path) -> None:
    import json

    history = tmp_path / "history.sqlite3"
    docs = []
    for ranks in ("1", "2"):
        out = tmp_path / f"r{ranks}.json"
        proc = run_pitstop(
            "doctor", "--quiet", "--warmup", "3", "--steps", "8", "--history", str(history), "--json", str(out),
            "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", ranks, SCRIPT,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        docs.append(json.loads(out.read_text()))
    one, two = docs
    assert one["scaling"] is None  # one rank: nothing to scale
    scaling = two["scaling"]
    assert scaling["source"].startswith("history run 1: the same job on 1 rank")
    assert scaling["single_rank_tokens_per_s"] == pytest.approx(one["metrics"]["real_tokens_per_s"])
    expected = two["metrics"]["real_tokens_per_s"] / (2 * one["metrics"]["real_tokens_per_s"])
    assert scaling["efficiency"] == pytest.approx(expected)
    assert two["metrics"]["scaling_efficiency"] == pytest.approx(expected)


def test_accelerate_launch_on_two_machines_gives_one_report_on_the_machine_of_rank_0(tmp_path: Path) -> None:
    """`accelerate launch --num_machines 2 --machine_rank i`, one process per "machine". On a machine without
    GPUs `--multi_gpu` is still the flag that makes accelerate start torchrun's agent (`--cpu` takes its simple
    launcher, which expects mpirun); the script's Accelerator(cpu=True) then joins with gloo."""
    import json

    pytest.importorskip("accelerate")
    port = _free_port()
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    commands = []
    for machine in (0, 1):
        cmd = [
            accelerate,
            "launch",
            "--num_machines",
            "2",
            "--machine_rank",
            str(machine),
            "--num_processes",
            "2",
        ]
        cmd += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--multi_gpu"]
        cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPTS / "accelerate_ranks.py")]
        commands.append(cmd)
    slow = {"PITSTOP_GATHER_TIMEOUT_S": "60"}
    (node0, out0), (node1, out1) = _together(tmp_path, commands, [slow, slow])
    assert node0.returncode == 0, node0.stderr
    doc = json.loads(out0.read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["steps"] == 8 for r in doc["ranks"])
    assert doc["environment"]["framework"] == "accelerate" and doc["environment"]["world_size"] == 2
    assert doc["communication"]["matched_collectives"] == 16  # as under torchrun: DDP is DDP
    assert not doc["missing_ranks"]
    assert node1.returncode == 0, node1.stderr
    assert "the job's report is on" in node1.stderr and "#0" in node1.stderr
    assert not out1.exists()


def _srun_envs(style: str) -> list[dict[str, str]]:
    """What Slurm sets for two tasks on one node (and, for "env", what a batch script exports from it)."""
    port = str(_free_port())
    envs = []
    for rank in (0, 1):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PITSTOP_GATHER_TIMEOUT_S": "60"}
        env |= {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
        }
        if style == "env":
            env |= {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
        envs.append(env)
    return envs


@pytest.mark.parametrize("style", ["env", "slurm"])
def test_srun_one_pitstop_per_rank_gives_one_report_on_rank_0(tmp_path: Path, style: str) -> None:
    """`srun pitstop doctor -- python train.py`, simulated: one pitstop per rank, both tasks on one node (the
    case a gather keyed by node got wrong). "env": a batch script exported RANK / WORLD_SIZE / LOCAL_RANK /
    LOCAL_WORLD_SIZE from Slurm's variables; "slurm": the script reads SLURM_PROCID / SLURM_NTASKS itself."""
    import json

    command = [sys.executable, SCRIPT, *(["--from-slurm"] if style == "slurm" else [])]
    (rank0, out0), (rank1, out1) = _together(tmp_path, [command, command], _srun_envs(style))
    assert rank0.returncode == 0, rank0.stderr
    doc = json.loads(out0.read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert all(r["steps"] == 8 for r in doc["ranks"])
    assert doc["environment"]["world_size"] == 2
    assert doc["communication"]["matched_collectives"] == 16  # buffer broadcast + gradient bucket per step
    assert not doc["missing_ranks"]
    assert rank1.returncode == 0, rank1.stderr
    assert "the job's report is on" in rank1.stderr and "#0" in rank1.stderr
    assert not out1.exists()


def test_srun_with_steps_auto_keeps_one_fixed_window_on_every_rank(tmp_path: Path) -> None:
    """Ranks cannot agree on an adaptive window; with no WORLD_SIZE (the script sizes its group from Slurm's
    variables) each probe learns it has peers only from the group, and must still keep the fixed 50 steps."""
    import json

    command = [sys.executable, SCRIPT, "--from-slurm", "--steps", "200"]
    window = ("--warmup", "3", "--steps", "auto")
    (rank0, out0), (rank1, _) = _together(tmp_path, [command, command], _srun_envs("slurm"), window)
    assert rank0.returncode == 0, rank0.stderr
    doc = json.loads(out0.read_text())
    assert [(r["rank"], r["steps"]) for r in doc["ranks"]] == [(0, 50), (1, 50)]
    assert not doc["missing_ranks"]
    assert rank1.returncode == 0, rank1.stderr
