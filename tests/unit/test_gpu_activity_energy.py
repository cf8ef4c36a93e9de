"""Energy per step and per real token (the energy counter's increases, or power × time said as an estimate),
and the cost of a million real tokens at a price per GPU-hour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop.cli.analyze import run_analyze
from pitstop.cli.errors import UserError
from pitstop.cli.outputs import Outputs
from pitstop.core.profile import ActivitySample, GpuActivity, RunProfile
from pitstop.diagnose.energy import COUNTER, ESTIMATE, cost_per_million_tokens, energy_of
from pitstop.diagnose.metrics import compute_metrics


def with_counter(
    p: RunProfile, joules: list[float | None], timed: bool = True, power: float = 100.0
) -> RunProfile:
    for rank in p.ranks:
        samples = [ActivitySample(t=float(i), energy_j=e, power_w=power) for i, e in enumerate(joules)]
        rank.gpu_activity = GpuActivity(
            source="dcgm-exporter", gpu=str(rank.rank), samples=samples, timed=timed
        )
    return p


def test_power_from_the_counter_per_step_and_per_real_token() -> None:
    # 2 GPUs, each counter rising 650 J a second; steps of 0.1 s moving 8 × 1024 real tokens per rank
    p = with_counter(profile("cuda", steps(wall=0.1), util=95.0, ranks=2), [1e6 + 650 * i for i in range(6)])
    m = compute_metrics(p)
    assert m.energy_basis == COUNTER and m.gpu_power_w == pytest.approx(1300)
    assert m.joules_per_step == pytest.approx(130)
    assert m.real_tokens_per_s == pytest.approx(2 * 8192 / 0.1)
    assert m.joules_per_real_token == pytest.approx(1300 / (2 * 8192 / 0.1))


def test_power_samples_are_an_estimate() -> None:
    m = compute_metrics(profile("cuda", steps(wall=0.1), util=95.0))  # the factory's NVML samples: 400 W
    assert m.energy_basis == ESTIMATE and m.gpu_power_w == pytest.approx(400)
    assert m.joules_per_step == pytest.approx(40) and m.joules_per_real_token == pytest.approx(400 / 81920)
    assert compute_metrics(profile("cpu", steps())).gpu_power_w is None


def test_a_process_over_several_gpus_is_billed_and_powered_for_each() -> None:
    # one process with its model over 4 GPUs reads the counter of the one it computes on (650 W); the other
    # three take turns with it through each step, so the job draws 4 × 650 W, said as an estimate
    p = with_counter(profile("cuda", steps(wall=0.1), util=95.0, gpus_held=4), [650.0 * i for i in range(6)])
    m = compute_metrics(p)
    assert m.gpu_power_w == pytest.approx(4 * 650) and m.joules_per_step == pytest.approx(260)
    assert m.energy_basis is not None and m.energy_basis.startswith(COUNTER)
    assert "first GPU" in m.energy_basis and "taken to draw as much" in m.energy_basis
    one = compute_metrics(
        with_counter(profile("cuda", steps(wall=0.1), util=95.0), [650.0 * i for i in range(6)])
    )
    assert one.energy_basis == COUNTER and one.gpu_power_w == pytest.approx(650)


def test_mfu_divides_by_every_gpu_a_process_holds() -> None:
    one = compute_metrics(profile("cuda", steps(wall=0.1), util=95.0, gpu_name="NVIDIA H100 80GB HBM3"))
    four = compute_metrics(
        profile("cuda", steps(wall=0.1), util=95.0, gpu_name="NVIDIA H100 80GB HBM3", gpus_held=4)
    )
    assert one.mfu is not None and four.mfu == pytest.approx(one.mfu / 4)


def test_a_restarted_counter_counts_only_its_increases() -> None:
    p = with_counter(profile("cuda", steps(), util=95.0), [100.0, 200.0, 50.0, 150.0])
    energy = energy_of(p, 0.1, None)
    assert energy is not None and energy.power_w == pytest.approx(100) and energy.basis == COUNTER


def test_an_untimed_counter_falls_back_to_the_power_samples() -> None:
    p = with_counter(profile("cuda", steps(), util=95.0), [0.0, 650.0, 1300.0], timed=False, power=610.0)
    energy = energy_of(p, 0.1, None)
    assert energy is not None and energy.basis == ESTIMATE and energy.power_w == pytest.approx(610)
    assert energy.joules_per_real_token is None


def test_cost_per_million_real_tokens() -> None:
    assert cost_per_million_tokens(2.0, 1, 81920) == pytest.approx(2.0 / 3600 / 81920 * 1e6)
    assert cost_per_million_tokens(2.0, 8, 81920) == pytest.approx(8 * 2.0 / 3600 / 81920 * 1e6)
    assert cost_per_million_tokens(2.0, 1, None) is None


def _scrapes(tmp_path: Path) -> Path:
    text = ""
    for i in range(5):
        text += f"{1_700_000_000 + i}\n"
        text += "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
        text += "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        text += f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-0"}} {5_000_000 + 700_000 * i}\n'
        text += 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-0"} 690.0\n'
        text += 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0"} 97\n'
    path = tmp_path / "scrapes.txt"
    path.write_text(text)
    results = tmp_path / "train_results.json"
    results.write_text(
        json.dumps({"train_runtime": 100.0, "num_input_tokens_seen": 4_000_000, "global_step": 500})
    )
    return tmp_path


def test_analyze_writes_energy_and_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    folder = _scrapes(tmp_path / "run")
    out = tmp_path / "out.json"
    monkeypatch.delenv("PITSTOP_PRICE_PER_GPU_HOUR", raising=False)
    code = run_analyze([folder], None, None, None, False, Outputs(json=out), price_per_gpu_hour=3.6)
    doc = json.loads(out.read_text())
    assert code == 0
    m = doc["metrics"]
    assert m["energy_basis"] == COUNTER and m["gpu_power_w"] == pytest.approx(700)
    assert m["real_tokens_per_s"] == pytest.approx(40_000)
    assert m["joules_per_step"] == pytest.approx(700 * 0.2) and m["joules_per_real_token"] == pytest.approx(
        700 / 40_000
    )
    cost = doc["cost"]  # the keys analyze wrote first keep their meaning; keys are only ever added
    assert (cost["price_per_gpu_hour"], cost["gpus"]) == (3.6, 1)
    assert cost["per_million_real_tokens"] == pytest.approx(0.025)
    assert cost["per_hour"] == pytest.approx(3.6) and cost["why"] is None


def test_price_from_the_environment_and_refused_when_not_a_price(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run").mkdir()
    folder = _scrapes(tmp_path / "run")
    out = tmp_path / "out.json"
    monkeypatch.setenv("PITSTOP_PRICE_PER_GPU_HOUR", "7.2")
    run_analyze([folder], None, None, None, False, Outputs(json=out))
    assert json.loads(out.read_text())["cost"]["per_million_real_tokens"] == pytest.approx(0.05)
    monkeypatch.setenv("PITSTOP_PRICE_PER_GPU_HOUR", "cheap")
    with pytest.raises(UserError) as err:
        run_analyze([folder], None, None, None, False, Outputs(json=out))
    assert err.value.code == 2 and "PITSTOP_PRICE_PER_GPU_HOUR" in str(err.value)
    with pytest.raises(UserError):
        run_analyze([folder], None, None, None, False, Outputs(json=out), price_per_gpu_hour=float("nan"))
