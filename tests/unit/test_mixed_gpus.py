"""mixed_gpus: a job whose ranks run on different GPU models names the slower card, and every multi-rank report
shows the GPU model per rank, grouped.

A CPU machine cannot run one job on two GPU models, so the rule is checked on hand-made profiles (the live
probe's shape: timed collectives per rank, each rank's card in its environment) and on recorded inputs in the
tools' layouts: per-rank Kineto traces whose ``deviceProperties`` list both cards and whose kernels ran on the
rank's own device, and an nvidia-smi CSV log of GPUs with different names."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr
from tests.conftest import run_pitstop
from tests.factories import profile as factory_profile

from pitstop.core.findings import Finding
from pitstop.core.profile import CollectiveRecord, Environment, RankProfile, RunProfile, StepRecord
from pitstop.core.vocabulary import CauseId, Framework, RemedyId
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.diagnose.causes.mixed_gpus import LOG_ONLY_CONFIDENCE, MEASURED_CONFIDENCE, TABLE_CONFIDENCE
from pitstop.diagnose.gpu_models import gpu_models_line, rank_span
from pitstop.ingest.load import Inputs, load_run
from pitstop.remedies import remedy

SXM = "NVIDIA A100-SXM4-80GB"
PCIE = "NVIDIA A100-PCIE-40GB"
RTX3090 = "NVIDIA GeForce RTX 3090"
RTX4090 = "NVIDIA GeForce RTX 4090"
H100 = "NVIDIA H100 80GB HBM3"
STEP = 0.100
TRANSFER = 0.010


def _job(names: list[str], slow: dict[int, float], framework: str = "pytorch") -> RunProfile:
    """A data-parallel job on one machine, as the live probe records it: 10 steps, one asynchronous gradient
    all-reduce per step (DDP's shape), each rank on its own clock. A rank in ``slow`` computes that many seconds
    longer per step; the all-reduce completes when the last rank has arrived, so every other rank waits."""
    world = len(names)
    late = max(slow.values(), default=0.0)
    ranks = []
    for rank, name in enumerate(names):
        offset = 3.0 * rank - 7.0  # every rank's clock has its own origin
        records, collectives = [], []
        for i in range(10):
            t0 = i * (STEP + late)
            compute = STEP - TRANSFER + slow.get(rank, 0.0)
            arrive = t0 + compute
            done = t0 + STEP - TRANSFER + late + TRANSFER
            records.append(
                StepRecord(
                    index=i + 1,
                    wall_s=STEP + late,
                    forward_s=compute * 0.4,
                    backward_s=compute * 0.6
                    + (done - arrive),  # DDP waits for the all-reduce inside backward
                    optimizer_s=0.0,
                    tokens=4096,
                    real_tokens=4096,
                    end_t=done + offset,
                )
            )
            collectives.append(
                CollectiveRecord(
                    step=i + 1,
                    op="all_reduce",
                    group=",".join(map(str, range(world))),
                    seq=i,
                    bytes=100_000_000,
                    size=world,
                    issued_t=arrive + offset,
                    done_t=done + offset,
                    source="ddp",
                    clock="device",
                )
            )
        env = Environment(
            device="cuda", gpu_name=name, world_size=world, dist_backend="nccl", framework=framework
        )
        ranks.append(
            RankProfile(
                rank=rank,
                local_rank=rank,
                hostname="node-a",
                steps=records,
                collectives=collectives,
                environment=env,
            )
        )
    return RunProfile(source="doctor", ranks=ranks)


def _finding(d: Diagnosis, cause: str) -> Finding | None:
    return next((f for f in d.findings if f.cause == cause), None)


EIGHT = [SXM] * 6 + [PCIE] * 2


def test_six_sxm_and_two_pcie_cards_name_the_pcie_cards_and_their_cost() -> None:
    d = diagnose(_job(EIGHT, {6: 0.035, 7: 0.030}))
    f = _finding(d, CauseId.MIXED_GPUS)
    assert f is not None
    ev = f.evidence
    assert ev["gpu_models"] == {SXM: [0, 1, 2, 3, 4, 5], PCIE: [6, 7]}
    assert ev["slow_model"] == PCIE and ev["slow_ranks"] == [6, 7] and ev["fast_model"] == SXM
    assert ev["slower_by"] == "measured" and f.confidence == MEASURED_CONFIDENCE
    # the hardware table: the same 312 TFLOP/s bf16 peak, 2,039 vs 1,555 GB/s memory bandwidth
    assert ev["peak_ratio"] == pytest.approx(1.0) and ev["memory_bandwidth_ratio"] == pytest.approx(
        1.311, abs=1e-3
    )
    # measured: the PCIe ranks compute 30-35 ms longer than the SXM ranks' 90 ms
    assert ev["compute_ratio"] == pytest.approx((0.090 + 0.0325) / 0.090, abs=1e-3)
    # the SXM ranks wait for the last PCIe rank (35 ms of a 135 ms step)
    assert ev["others_wait_frac_of_step"] == pytest.approx(0.035 / 0.135, abs=1e-3)
    assert ev["wait_frac_per_rank"]["0"] == pytest.approx(0.035 / 0.135, abs=1e-3)  # type: ignore[index]
    lost = ev["lost_frac_of_step"]
    assert lost == pytest.approx(0.0325 / 0.135, abs=2e-3)  # bounded by the median PCIe rank's extra compute
    assert f.est_speedup == pytest.approx(1 / (1 - lost), rel=1e-3)  # type: ignore[operator]
    assert "the slower card" in f.summary and "Ranks 6-7 run on NVIDIA A100-PCIE-40GB" in f.summary
    assert "1.31× the memory bandwidth" in f.summary
    # six of eight cards alone, each waiting no more: 6/8 / (1 − 26%) of today's throughput
    assert ev["fast_cards_only_throughput_ratio"] == pytest.approx(0.75 / (1 - 0.035 / 0.135), abs=1e-3)
    assert "ranks 6-7 on NVIDIA A100-PCIE-40GB" in f.fix.text
    assert f.fix.snippets["pytorch"].startswith(
        "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 torchrun --nproc_per_node 6"
    )
    assert "--include localhost:0,1,2,3,4,5" in f.fix.snippets["deepspeed"]
    # the straggler the others wait for is a PCIe rank, late for its compute: one finding for those seconds
    assert d.ranks_analysis is not None and d.ranks_analysis.straggler in (6, 7)
    assert _finding(d, CauseId.STRAGGLER) is None


def test_one_model_everywhere_is_silent_and_the_straggler_keeps_its_finding() -> None:
    d = diagnose(_job([SXM] * 8, {6: 0.035, 7: 0.030}))
    assert _finding(d, CauseId.MIXED_GPUS) is None
    s = _finding(d, CauseId.STRAGGLER)
    assert s is not None and s.evidence["slow_rank"] == 6 and s.evidence["reason"] == "compute"


def test_a_straggler_on_the_faster_card_is_not_the_mix() -> None:
    # the slow rank runs on the faster model (a throttled or overloaded 4090): the mix explains nothing
    d = diagnose(_job([RTX3090, RTX4090, RTX4090, RTX4090], {2: 0.04}))
    s = _finding(d, CauseId.STRAGGLER)
    assert s is not None and s.evidence["slow_rank"] == 2
    f = _finding(d, CauseId.MIXED_GPUS)
    # measured, the 4090 ranks (median) compute no longer than the 3090: no slow card to name
    assert f is None


def test_a_3090_and_4090_pair_with_measured_compute() -> None:
    d = diagnose(_job([RTX4090, RTX3090], {1: 0.08}, framework="hf_trainer"))
    f = _finding(d, CauseId.MIXED_GPUS)
    assert f is not None
    ev = f.evidence
    assert ev["slow_model"] == RTX3090 and ev["slow_ranks"] == [1]
    assert ev["peak_dtype"] == "bf16" and ev["peak_ratio"] == pytest.approx(165.2 / 71, abs=1e-3)
    assert ev["compute_ratio"] == pytest.approx(0.17 / 0.09, abs=1e-3)
    assert ev["others_wait_frac_of_step"] == pytest.approx(0.08 / 0.18, abs=1e-3)
    assert f.severity == "high"
    assert (
        "Rank 1 runs on NVIDIA GeForce RTX 3090" in f.summary
        and "the rank on the faster card waits" in f.summary
    )
    # one 4090 alone does half the ranks' work without waiting: below today's throughput, so the advice says so
    assert ev["fast_cards_only_throughput_ratio"] == pytest.approx(0.5 / (1 - 0.08 / 0.18), abs=1e-3)
    assert "only ×0.90" in f.fix.text
    assert "gradient_accumulation_steps" in f.fix.snippets["hf_trainer"]
    assert _finding(d, CauseId.STRAGGLER) is None


def test_measured_equal_compute_on_two_models_is_silent() -> None:
    # the cards differ on paper, but this job computes as long on both (another limit sets its pace)
    assert _finding(diagnose(_job([RTX4090, RTX3090], {})), CauseId.MIXED_GPUS) is None


def test_without_per_rank_measurement_the_hardware_table_names_the_slower_card() -> None:
    p = factory_profile("cuda", util=95.0, ranks=4, world_size=4)  # steps, but no collectives timed
    for r in p.ranks[2:]:
        r.environment.gpu_name = PCIE
    for r in p.ranks[:2]:
        r.environment.gpu_name = SXM
    d = diagnose(p)
    f = _finding(d, CauseId.MIXED_GPUS)
    assert f is not None and f.confidence == TABLE_CONFIDENCE
    assert f.evidence["slower_by"] == "hardware table" and f.evidence["slow_ranks"] == [2, 3]
    assert f.evidence["compute_ratio"] is None and f.evidence["lost_frac_of_step"] is None
    assert f.est_speedup is not None and f.est_speedup > 1.0
    assert "not measured per rank" in f.speedup_basis and "memory bandwidth ratio" in f.speedup_basis


def test_models_the_table_does_not_know_are_named_without_a_verdict() -> None:
    p = factory_profile("cuda", util=95.0, ranks=2, world_size=2)
    p.ranks[0].environment.gpu_name = "Acme Tensor 9"
    p.ranks[1].environment.gpu_name = "Acme Tensor 7"
    f = _finding(diagnose(p), CauseId.MIXED_GPUS)
    assert f is not None and f.est_speedup is None and f.severity == "low"
    assert f.evidence["slow_model"] is None and f.evidence["slower_by"] is None
    assert "which one that is is not known" in f.summary and "not in pitstop's hardware table" in f.summary
    assert "time one step on each kind alone" in f.fix.text


def test_spellings_of_one_model_are_one_model() -> None:
    p = _job([SXM, "NVIDIA  A100-SXM4-80GB ", "nvidia a100-sxm4-80gb"], {})
    assert _finding(diagnose(p), CauseId.MIXED_GPUS) is None
    assert gpu_models_line(p) == f"3× {SXM}"


def test_rank_spans_and_the_grouped_line() -> None:
    assert rank_span([0, 1, 2, 3, 4, 5, 7]) == "ranks 0-5, 7" and rank_span([3]) == "rank 3"
    p = _job(EIGHT, {})
    assert gpu_models_line(p) == f"ranks 0-5: {SXM} · ranks 6-7: {PCIE}"
    p.ranks[7].environment.gpu_name = None
    assert gpu_models_line(p) == f"ranks 0-5: {SXM} · rank 6: {PCIE} · rank 7: GPU not named"
    assert gpu_models_line(_job([SXM], {})) is None  # one rank: nothing per rank to show


def test_the_remedy_speaks_every_framework_and_is_not_tunable() -> None:
    r = remedy(RemedyId.MATCH_GPUS)
    assert not r.tunable
    params: dict[str, Any] = {
        "slow_model": PCIE,
        "slow_ranks": "ranks 6-7",
        "fast_model": SXM,
        "fast_ranks": 6,
        "world_size": 8,
        "fast_devices": "0,1,2,3,4,5",
        "fast_only_ratio": 1.02,
    }
    snippets = {fw: r.advice(fw, params).snippet for fw in Framework}
    assert "devices=[0,1,2,3,4,5]" in snippets[Framework.LIGHTNING]
    assert "accelerate launch --num_processes 6" in snippets[Framework.ACCELERATE]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 torchrun --nproc_per_node 6" in snippets[Framework.TRL]
    text = r.advice(Framework.DEEPSPEED, params).text
    assert "ranks 6-7 on NVIDIA A100-PCIE-40GB set the pace" in text and "×1.02" in text
    assert "DeepSpeed" in text and "same micro-batch" in text  # no framework splits work by speed
    bare = r.advice(Framework.PYTORCH, {})
    assert "nvidia-smi -L" in bare.snippet  # the device list it does not know is not invented


# -- reports ---------------------------------------------------------------------------------------------


def _terminal(d: Diagnosis) -> str:
    from rich.console import Console

    from pitstop.report.terminal import render

    console = Console(record=True, width=200)
    render(d, console)
    return console.export_text()


def test_terminal_json_and_html_show_the_models_per_rank_grouped() -> None:
    from pitstop.diagnose.document import read_run
    from pitstop.report.html import render_html

    d = diagnose(_job(EIGHT, {6: 0.035, 7: 0.030}))
    text = _terminal(d)
    assert f"GPUs: ranks 0-5: {SXM} · ranks 6-7: {PCIE}" in text
    assert f"on 6× {SXM} + 2× {PCIE} · 8 ranks" in text  # the headline does not take rank 0's card
    rows = [line for line in text.splitlines() if PCIE in line and "┃" not in line and "│" in line]
    assert len([line for line in rows if "node-a" in line]) == 2  # the per-rank table: a GPU column for a mix
    doc = json.loads(json.dumps(d.to_dict(), default=str))
    assert doc["environment"]["gpu_models"] == {SXM: [0, 1, 2, 3, 4, 5], PCIE: [6, 7]}
    assert [r["environment"]["gpu_name"] for r in doc["profile"]["ranks"]] == EIGHT
    html = render_html(doc)  # read back from the saved document, as `pitstop report` does
    assert f"ranks 0-5: {SXM} · ranks 6-7: {PCIE}" in html
    assert "GPUs per rank" in html and 'data-figure="gpu-models"' in html
    assert f"6× {SXM} + 2× {PCIE}" in html
    assert _terminal(read_run(doc)).count(f"GPUs: ranks 0-5: {SXM} · ranks 6-7: {PCIE}") == 1


def test_one_model_on_every_rank_is_grouped_in_one_phrase() -> None:
    from pitstop.report.html import render_html

    d = diagnose(_job([H100] * 8, {3: 0.03}))
    text = _terminal(d)
    assert f"GPUs: 8× {H100}" in text
    assert "│ GPU" not in text and "┃ GPU" not in text  # no per-rank column when every rank shares the card
    assert f"on {H100} · 8 ranks" in text
    html = render_html(d)
    assert f"8× {H100}" in html
    assert d.to_dict()["environment"]["gpu_models"] == {H100: list(range(8))}


def test_a_one_rank_run_shows_no_per_rank_models() -> None:
    d = diagnose(factory_profile("cuda", util=95.0))
    assert "GPUs:" not in _terminal(d) and d.to_dict()["environment"]["gpu_models"] is None


# -- recorded inputs through `pitstop analyze` ------------------------------------------------------------

# Kineto's deviceProperties entry per visible device (torch.profiler's layout, cuda 12, driver 550)
DEVICE_PROPERTIES = {
    RTX4090: {"totalGlobalMem": 25393692672, "computeMajor": 8, "computeMinor": 9, "numSms": 128},
    RTX3090: {"totalGlobalMem": 25438126080, "computeMajor": 8, "computeMinor": 6, "numSms": 82},
}
COMMON = {
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 1536,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 102400,
    "sharedMemPerBlockOptin": 101376,
}


def _two_card_traces(folder: Path, cards: list[str], extra_kernel_us: float) -> Path:
    """Per-rank traces of a two-rank job on one machine with two different cards: each trace lists both
    devices (as Kineto does for every device the process sees) and its kernels run on the rank's own device;
    rank 1's kernels take ``extra_kernel_us`` longer per step (its card is slower)."""
    docs = kr.job(2, straggler=1, extra_kernel_us=extra_kernel_us)
    devices = [{"id": i, "name": name, **DEVICE_PROPERTIES[name], **COMMON} for i, name in enumerate(cards)]
    for rank, doc in enumerate(docs):
        doc["deviceProperties"] = copy.deepcopy(devices)
        for event in doc["traceEvents"]:
            if event.get("cat") == "kernel":
                event["args"]["device"] = rank
                event["pid"] = rank
    return kr.write_folder(folder, docs)


def test_per_rank_traces_with_two_cards_name_the_slower_one(tmp_path: Path) -> None:
    folder = _two_card_traces(tmp_path / "t", [RTX4090, RTX3090], extra_kernel_us=6000)
    profile = load_run(Inputs(paths=[folder], jobs=1))
    assert [r.environment.gpu_name for r in profile.ranks] == [RTX4090, RTX3090]  # each rank's own device
    d = diagnose(profile)
    f = _finding(d, CauseId.MIXED_GPUS)
    assert f is not None and f.confidence == MEASURED_CONFIDENCE
    ev = f.evidence
    assert ev["slow_model"] == RTX3090 and ev["slow_ranks"] == [1]
    assert ev["compute_ms_per_rank"] == {"0": pytest.approx(8.0), "1": pytest.approx(14.0)}  # 20 kernels each
    assert "traces" in str(ev["compute_source"]) and "traces" in str(ev["wait_source"])
    assert ev["others_wait_frac_of_step"] > 0.25  # type: ignore[operator]
    assert _finding(d, CauseId.STRAGGLER) is None  # the late rank is the 3090's: left to mixed_gpus
    same = _two_card_traces(tmp_path / "same", [RTX3090, RTX3090], extra_kernel_us=6000)
    d = diagnose(load_run(Inputs(paths=[same], jobs=1)))
    assert _finding(d, CauseId.MIXED_GPUS) is None
    s = _finding(d, CauseId.STRAGGLER)
    assert s is not None and "kernels take 6.0 ms more" in str(s.evidence["reason"])


SMI_LOG = """\
timestamp, index, name, utilization.gpu [%], memory.used [MiB], power.draw [W]
2026/02/10 09:00:00.000, 0, NVIDIA GeForce RTX 4090, 62 %, 20112 MiB, 301.55 W
2026/02/10 09:00:00.000, 1, NVIDIA GeForce RTX 3090, 99 %, 20020 MiB, 348.12 W
2026/02/10 09:00:00.000, 2, NVIDIA GeForce RTX 3090, 0 %, 1 MiB, 21.40 W
2026/02/10 09:00:01.000, 0, NVIDIA GeForce RTX 4090, 58 %, 20112 MiB, 296.80 W
2026/02/10 09:00:01.000, 1, NVIDIA GeForce RTX 3090, 100 %, 20020 MiB, 349.90 W
2026/02/10 09:00:01.000, 2, NVIDIA GeForce RTX 3090, 0 %, 1 MiB, 21.38 W
2026/02/10 09:00:02.000, 0, NVIDIA GeForce RTX 4090, 60 %, 20112 MiB, 299.02 W
2026/02/10 09:00:02.000, 1, NVIDIA GeForce RTX 3090, 99 %, 20020 MiB, 347.61 W
2026/02/10 09:00:02.000, 2, NVIDIA GeForce RTX 3090, 0 %, 1 MiB, 21.41 W
2026/02/10 09:00:03.000, 0, NVIDIA GeForce RTX 4090, 61 %, 20112 MiB, 300.13 W
2026/02/10 09:00:03.000, 1, NVIDIA GeForce RTX 3090, 100 %, 20020 MiB, 350.02 W
2026/02/10 09:00:03.000, 2, NVIDIA GeForce RTX 3090, 0 %, 1 MiB, 21.37 W
"""


def test_an_nvidia_smi_log_of_two_models_names_the_mix_from_the_table(tmp_path: Path) -> None:
    log = tmp_path / "gpus.csv"
    log.write_text(SMI_LOG)
    profile = load_run(Inputs(paths=[log]))
    d = diagnose(profile)
    f = _finding(d, CauseId.MIXED_GPUS)
    assert f is not None and f.confidence <= LOG_ONLY_CONFIDENCE
    assert f.evidence["slow_model"] == RTX3090 and f.evidence["slow_ranks"] == [1]  # GPU 2 never worked
    assert f.evidence["gpu_models"] == {RTX4090: [0], RTX3090: [1]}
    # no step measured: only the most it could gain
    assert f.est_speedup is None and "2.33×" in f.speedup_basis
    assert "GPUs: rank 0: NVIDIA GeForce RTX 4090 · ranks 1-2: NVIDIA GeForce RTX 3090" in _terminal(d)
    # only one kind of card worked: the idle one of another model is no mix
    log.write_text("\n".join(line for line in SMI_LOG.splitlines() if ", 0, NVIDIA" not in line) + "\n")
    assert _finding(diagnose(load_run(Inputs(paths=[log]))), CauseId.MIXED_GPUS) is None


@pytest.mark.slow
def test_pitstop_analyze_writes_the_mix_to_json_and_html(tmp_path: Path) -> None:
    folder = _two_card_traces(tmp_path / "t", [RTX4090, RTX3090], extra_kernel_us=6000)
    out, page = tmp_path / "run.json", tmp_path / "run.html"
    proc = run_pitstop(
        "analyze", str(folder), "--jobs", "1", "--json", str(out), "--html", str(page), "--no-history"
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    finding = next(f for f in doc["findings"] if f["cause"] == "mixed_gpus")
    assert finding["evidence"]["slow_model"] == RTX3090
    assert not any(f["cause"] == "straggler" for f in doc["findings"])
    assert doc["environment"]["gpu_models"] == {RTX4090: [0], RTX3090: [1]}
    assert f"rank 0: {RTX4090} · rank 1: {RTX3090}" in page.read_text()
    assert "GPUs: rank 0: NVIDIA GeForce RTX 4090 · rank 1: NVIDIA GeForce RTX 3090" in proc.stdout
