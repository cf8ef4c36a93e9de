"""nvidia-smi logs, Hugging Face Trainer outputs and training configs into RunProfiles and findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.nvidia_smi import read_smi


def _findings(*paths: Path, **kw: object) -> dict[str, object]:
    d = diagnose(load_run(Inputs(paths=list(paths), **kw)))  # type: ignore[arg-type]
    return {f.cause: f for f in d.findings}


def test_real_nvidia_smi_log(shared_data: Path) -> None:
    log = read_smi(next((shared_data / "nvidia_smi").glob("*.csv")))
    assert len(log.gpus) == 1 and log.gpus[0].name == "NVIDIA GeForce RTX 4090"
    samples = log.gpus[0].samples
    assert len(samples) == 2619
    assert log.interval_s == pytest.approx(1.0, abs=0.05)
    assert (
        samples[0].util == 1
        and samples[0].mem_used == 1129 * 2**20
        and samples[0].power_w == pytest.approx(33.09)
    )
    assert samples[-1].t == pytest.approx(48 * 60 + 0.454, abs=0.01)  # 15:36:53.507 → 16:24:53.961
    mean = sum(s.util or 0 for s in samples) / len(samples)
    d = diagnose(load_run(Inputs(paths=[next((shared_data / "nvidia_smi").glob("*.csv"))])))
    assert d.metrics.gpu_util == pytest.approx(mean / 100)
    assert d.metrics.source_of_util == "nvidia-smi"


def _smi(tmp_path: Path, name: str, rows: list[str], header: str | None) -> Path:
    path = tmp_path / name
    path.write_text(((header + "\n") if header else "") + "\n".join(rows) + "\n")
    return path


def test_interleaved_gpus_and_an_idle_one(tmp_path: Path) -> None:
    rows = []
    for t in range(60):
        for gpu, util in ((0, 95), (1, 93), (2, 0), (3, 94)):
            rows.append(
                f"2026/01/03 10:00:{t:02d}.000, {gpu}, {util} %, {20000 if util else 3} MiB, 81559 MiB"
            )
    path = _smi(
        tmp_path,
        "gpus.csv",
        rows,
        "timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]",
    )
    log = read_smi(path)
    assert [g.key for g in log.gpus] == ["0", "1", "2", "3"]
    assert all(len(g.samples) == 60 for g in log.gpus)
    f = _findings(path)["idle_gpu"]
    assert f.evidence["idle_gpus"] == [2]  # type: ignore[attr-defined]
    assert f.severity == "high"  # type: ignore[attr-defined]


def test_headerless_log_with_units_and_reordered_columns(tmp_path: Path) -> None:
    rows = [
        f"{40 + (t % 3)} %, 2026/01/03 10:00:{t:02d}.000, 1000 MiB, NVIDIA A100-SXM4-80GB" for t in range(30)
    ]
    log = read_smi(_smi(tmp_path, "noheader.csv", rows, None))
    assert len(log.gpus) == 1 and log.gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert [s.util for s in log.gpus[0].samples[:3]] == [40, 41, 42]


def test_nounits_with_header_and_not_supported_values(tmp_path: Path) -> None:
    rows = [f"2026/01/03 10:00:{t:02d}.000, {t % 2}, 50, [N/A]" for t in range(40)]
    log = read_smi(_smi(tmp_path, "nounits.csv", rows, "timestamp, index, utilization.gpu, power.draw"))
    assert len(log.gpus) == 2
    assert log.gpus[0].samples[0].power_w is None  # [N/A] is unknown, not zero


def test_periodic_dips_point_at_waiting_between_steps(tmp_path: Path) -> None:
    rows = [
        f"2026/01/03 10:{t // 60:02d}:{t % 60:02d}.000, 0, {3 if t % 5 == 0 else 97} %, 30000 MiB"
        for t in range(2, 600)
    ]
    path = _smi(tmp_path, "dips.csv", rows, "timestamp, index, utilization.gpu [%], memory.used [MiB]")
    f = _findings(path)["dataloader_bound"]
    assert f.confidence < 0.5  # type: ignore[attr-defined]
    assert f.evidence["dips"] >= 100  # type: ignore[attr-defined]
    assert f.evidence["idle_share_while_running"] == pytest.approx(0.2, abs=0.01)  # type: ignore[attr-defined]


def test_trainer_results_give_rates_and_mfu(shared_data: Path) -> None:
    results = next((shared_data / "trainer_state").glob("*train_results.json"))
    d = diagnose(load_run(Inputs(paths=[results], gpu="H100-SXM")))
    m = d.metrics
    assert m.real_tokens_per_s == pytest.approx(890240 / 701.9971, rel=1e-6)
    assert m.hf_flops_per_s == pytest.approx(1.949640026161152e16 / 701.9971, rel=1e-6)
    assert m.mfu == pytest.approx(1.949640026161152e16 / 701.9971 / 989.4e12, rel=1e-6)
    assert m.compute_dtype == "bf16 (assumed)"


def test_trainer_state_counts_evaluations(shared_data: Path) -> None:
    state = next((shared_data / "trainer_state").glob("*trainer_state.json"))
    profile = load_run(Inputs(paths=[state]))
    assert profile.totals is not None
    assert profile.totals.evals == 14 and profile.totals.eval_s == pytest.approx(4357.1, abs=0.5)
    assert profile.totals.steps == 2800 and profile.totals.saves == 14
    f = _findings(state)["eval_overhead"]
    assert "14 evaluations" in f.summary  # type: ignore[attr-defined]


def test_llama_factory_args_with_results(shared_data: Path) -> None:
    folder = shared_data / "trainer_state"
    found = _findings(*folder.glob("travelucky*"))
    assert "eval_overhead" in found  # eval_steps: 10 and save_steps: 10
    assert "padding_waste" in found  # packing: false
    env = load_run(Inputs(paths=list(folder.glob("travelucky*")))).environment
    assert (env.micro_batch_size, env.grad_accum_steps, env.autocast_dtype, env.packing) == (
        2,
        8,
        "bf16",
        False,
    )
    assert env.framework == "hf_trainer"


@pytest.mark.parametrize(
    ("name", "packing", "attention", "checkpointing", "micro", "accum"),
    [
        ("axolotl__llama-3__lora-1b.yml", True, "flash_attention_2", True, 2, 2),
        ("axolotl__llama-3__instruct-lora-8b.yml", False, "flash_attention_2", True, 2, 4),
        ("axolotl__mistral__bigstral__bigstral-ds-zero3.yaml", True, "flash_attention_2", True, 1, 1),
    ],
)
def test_axolotl_configs(
    shared_data: Path, name: str, packing: bool, attention: str, checkpointing: bool, micro: int, accum: int
) -> None:
    env = load_run(Inputs(paths=[shared_data / "configs" / "axolotl" / name], configs_only=True)).environment
    assert (env.packing, env.attention.implementation, env.gradient_checkpointing) == (
        packing,
        attention,
        checkpointing,
    )
    assert (env.micro_batch_size, env.grad_accum_steps) == (micro, accum)


def test_axolotl_finds_its_deepspeed_config_among_the_inputs(shared_data: Path) -> None:
    axolotl = shared_data / "configs" / "axolotl" / "axolotl__mistral__bigstral__bigstral-ds-zero3.yaml"
    alone = load_run(Inputs(paths=[axolotl], configs_only=True))
    assert alone.environment.offload is None
    assert any("was not found" in n for n in alone.notes)
    ds = (
        shared_data
        / "configs"
        / "deepspeed"
        / "axolotl__deepspeed_configs__zero3_bf16_cpuoffload_params.json"
    )
    both = load_run(Inputs(paths=[axolotl, ds], configs_only=True))
    assert (both.environment.zero_stage, both.environment.offload) == (3, {"param": "cpu"})
    assert "offload_bound" in {f.cause for f in diagnose(both).findings}


def test_offload_check_knows_when_the_model_fits(tmp_path: Path, shared_data: Path) -> None:
    presets = json.loads((shared_data / "configs" / "model_presets_mlc_llm.json").read_text())
    name = "llama3_2_1b"
    model = tmp_path / "config.json"
    model.write_text(json.dumps(presets[name]))
    ds = shared_data / "configs" / "deepspeed" / "axolotl__deepspeed_configs__zero2.json"
    f = _findings(ds, configs_only=True, gpu="H100-SXM", model=str(model))["offload_bound"]
    assert f.severity == "high"  # type: ignore[attr-defined]
    assert f.evidence["model_states_gib_per_gpu"] < 30  # type: ignore[attr-defined]


def test_accelerate_and_trl_configs(tmp_path: Path) -> None:
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"
        "num_processes: 8\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n"
        "  offload_param_device: none\n"
    )
    sft = tmp_path / "sft.json"
    sft.write_text(
        json.dumps(
            {
                "output_dir": "out",
                "per_device_train_batch_size": 1,
                "gradient_accumulation_steps": 16,
                "packing": False,
                "bf16": False,
                "fp16": False,
                "tf32": False,
                "model_init_kwargs": {"attn_implementation": "eager"},
                "dataloader_num_workers": 0,
            }
        )
    )
    profile = load_run(Inputs(paths=[acc, sft], configs_only=True))
    env = profile.environment
    assert (env.zero_stage, env.offload, env.world_size) == (3, {"optimizer": "cpu"}, 8)
    assert env.attention.implementation == "eager" and env.framework == "accelerate"
    causes = {f.cause for f in diagnose(profile).findings}
    assert {"offload_bound", "slow_attention", "padding_waste", "dataloader_bound"} <= causes
