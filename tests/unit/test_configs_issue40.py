"""Issue 40 offline: the settings that slow every step, read from configs as each framework resolves them
(TrainingArguments / SFTConfig, axolotl, LLaMA-Factory, Accelerate, LightningCLI), and from a run's saved log
(DDP's own warning, dynamo's recompile limit and recompiles, anomaly mode's warning). Each fact names the
setting that says it (``Environment.configured_by``); the logs in tests/corpus were written by real runs on this
machine (torchrun with gloo and find_unused_parameters=True; torch.compile recompiling under
``TORCH_LOGS=recompiles``, then ``detect_anomaly()``)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from pitstop.artifacts import IngestError
from pitstop.core.profile import Environment
from pitstop.diagnose import diagnose
from pitstop.ingest.detect import sniff
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.logs import LINE_LIMIT, read_log

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
ARGS = {"output_dir": "out", "per_device_train_batch_size": 4, "learning_rate": 1e-4, "logging_steps": 10}


def _env(
    tmp_path: Path,
    name: str,
    doc: dict[str, object] | str,
    also: tuple[Path, ...] = (),
    gpus: int | None = None,
) -> tuple[Environment, list[str]]:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    profile = load_run(Inputs(paths=[path, *also], gpus=gpus))
    return profile.environment, profile.notes


# --- TrainingArguments / SFTConfig -------------------------------------------------------------------------


def test_trainer_ddp_search_as_written_and_as_the_trainers_default(tmp_path: Path) -> None:
    env, _ = _env(tmp_path, "a.json", ARGS | {"ddp_find_unused_parameters": True})
    assert env.ddp_find_unused_parameters is True
    assert env.configured_by["ddp_find_unused_parameters"] == "a.json: ddp_find_unused_parameters=True"

    # unset, no checkpointing: the Trainer's default searches, but only on several processes
    env, notes = _env(tmp_path, "b.json", ARGS)
    assert env.ddp_find_unused_parameters is None
    assert any("ddp_find_unused_parameters is unset" in n and "--gpus" in n for n in notes)
    env, _ = _env(tmp_path, "c.json", ARGS, gpus=4)
    assert env.ddp_find_unused_parameters is True
    assert "the Trainer's default" in env.configured_by["ddp_find_unused_parameters"]
    env, notes = _env(tmp_path, "d.json", ARGS, gpus=1)  # one process: no DDP, nothing to say
    assert env.ddp_find_unused_parameters is None and not any("unset" in n for n in notes)

    # with checkpointing the default depends on the model's class (a PEFT-wrapped model still searches)
    env, _ = _env(tmp_path, "e.json", ARGS | {"gradient_checkpointing": True}, gpus=4)
    assert env.ddp_find_unused_parameters is None
    # a static graph: DDP does not search at all
    env, _ = _env(tmp_path, "f.json", ARGS | {"ddp_find_unused_parameters": True, "ddp_static_graph": True})
    assert env.ddp_find_unused_parameters is False


def test_the_process_count_from_an_accelerate_config_resolves_the_default(tmp_path: Path) -> None:
    accel = tmp_path / "accelerate.yaml"
    accel.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 8\n")
    env, _ = _env(tmp_path, "args.json", ARGS, also=(accel,))
    assert env.world_size == 8 and env.ddp_find_unused_parameters is True


@pytest.mark.parametrize(
    ("keys", "expected", "said"),
    [
        ({"gradient_checkpointing_kwargs": {"use_reentrant": True}}, True, "use_reentrant=True"),
        ({"gradient_checkpointing_kwargs": '{"use_reentrant": false}'}, False, "use_reentrant=False"),
        ({"gradient_checkpointing_kwargs": {"preserve_rng_state": False}}, True, "takes its default"),
        ({"gradient_checkpointing_kwargs": {"every_n_layers": 2}}, None, None),  # the Trainer's own keys
        ({}, None, None),  # no kwargs: transformers' default, which its release decides
    ],
)
def test_trainer_reentrant_checkpointing(
    tmp_path: Path, keys: dict[str, object], expected: bool | None, said: str | None
) -> None:
    env, _ = _env(tmp_path, "args.json", ARGS | {"gradient_checkpointing": True} | keys)
    assert env.gradient_checkpointing is True
    assert env.checkpoint_reentrant is expected
    if said is not None:
        assert said in env.configured_by["checkpoint_reentrant"]


def test_transformers_5_names_win_over_their_deprecated_aliases(tmp_path: Path) -> None:
    doc = ARGS | {
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": True},
        "gradient_checkpointing": False,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    env, _ = _env(tmp_path, "args.json", doc)
    assert env.gradient_checkpointing is True and env.checkpoint_reentrant is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, ["include_num_input_tokens_seen=True"]),
        ("non_padding", ["include_num_input_tokens_seen='non_padding'"]),
        ("all", ["include_num_input_tokens_seen='all'"]),
        ("no", []),
        (False, []),
    ],
)
def test_tokens_seen_is_a_gather_every_step(tmp_path: Path, value: object, expected: list[str]) -> None:
    env, _ = _env(tmp_path, "args.json", ARGS | {"include_num_input_tokens_seen": value})
    assert env.metric_sync_per_step == expected


def test_trainer_compile_cache_and_debug_settings(tmp_path: Path) -> None:
    env, notes = _env(
        tmp_path,
        "args.json",
        ARGS
        | {
            "torch_compile_backend": "neuron",
            "torch_empty_cache_steps": 1,
            "debug": "underflow_overflow",
            "full_determinism": True,
        },
    )
    assert env.torch_compile is True  # a backend alone switches it on (TrainingArguments' rule)
    assert env.compile_dynamic is False  # the Trainer compiles the neuron backend with dynamic=False
    assert env.empty_cache_steps == 1 and "every 1 steps" in env.configured_by["empty_cache_steps"]
    assert any("underflow_overflow" in n for n in notes)
    assert any("full_determinism" in n and "use_deterministic_algorithms" in n for n in notes)
    env, _ = _env(tmp_path, "b.json", ARGS | {"torch_compile": True})
    assert env.torch_compile is True and env.compile_dynamic is None  # dynamic=None: torch decides


# --- axolotl, LLaMA-Factory, Accelerate -----------------------------------------------------------------


AXOLOTL = "base_model: m\nmicro_batch_size: 2\nsequence_len: 1024\ndatasets: []\n"


def test_axolotl_resolutions(tmp_path: Path) -> None:
    env, _ = _env(
        tmp_path, "ax.yaml", AXOLOTL + "gradient_checkpointing: true\ninclude_tokens_per_second: true\n"
    )
    assert env.ddp_find_unused_parameters is False  # axolotl passes bool(None) in DDP
    assert env.checkpoint_reentrant is True  # its default kwargs: use_reentrant: True
    assert "axolotl" in env.configured_by["checkpoint_reentrant"]
    assert env.metric_sync_per_step == ["include_tokens_per_second=True"]
    env, _ = _env(
        tmp_path,
        "ax2.yaml",
        AXOLOTL
        + "gradient_checkpointing: true\nrl: dpo\nddp_find_unused_parameters: true\ntorch_empty_cache_steps: 4\n",
    )
    assert env.checkpoint_reentrant is None  # RL runs keep torch's / TRL's own default
    assert env.ddp_find_unused_parameters is True and env.empty_cache_steps == 4
    env, _ = _env(
        tmp_path,
        "ax3.yaml",
        AXOLOTL + "gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n",
    )
    assert env.checkpoint_reentrant is False


LLAMA_FACTORY = "stage: sft\ntemplate: llama3\ncutoff_len: 1024\nper_device_train_batch_size: 2\n"


def test_llama_factory_checkpoints_reentrantly_by_default(tmp_path: Path) -> None:
    env, _ = _env(tmp_path, "lf.yaml", LLAMA_FACTORY + "finetuning_type: lora\n", gpus=2)
    assert env.gradient_checkpointing is True and env.checkpoint_reentrant is True
    assert "use_reentrant_gc unset" in env.configured_by["checkpoint_reentrant"]
    assert env.ddp_find_unused_parameters is False  # its parser's choice for LoRA
    env, _ = _env(tmp_path, "lf2.yaml", LLAMA_FACTORY + "finetuning_type: full\nuse_reentrant_gc: false\n")
    assert env.checkpoint_reentrant is False
    assert env.ddp_find_unused_parameters is False  # a checkpointed PreTrainedModel: the Trainer's default
    env, _ = _env(
        tmp_path,
        "lf3.yaml",
        LLAMA_FACTORY + "finetuning_type: full\ndisable_gradient_checkpointing: true\n",
        gpus=2,
    )
    assert env.checkpoint_reentrant is None and env.ddp_find_unused_parameters is True


def test_accelerate_dynamo_and_debug(tmp_path: Path) -> None:
    text = (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\ndebug: true\n"
        "dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_use_dynamic: false\n"
    )
    env, notes = _env(tmp_path, "accelerate.yaml", text)
    assert env.torch_compile is True and env.compile_dynamic is False
    assert "dynamo_use_dynamic" in env.configured_by["compile_dynamic"]
    assert any("ACCELERATE_DEBUG_MODE" in n for n in notes)


# --- LightningCLI -------------------------------------------------------------------------------------------


LIGHTNING = """seed_everything: 0
trainer:
  accelerator: gpu
  devices: 4
  num_nodes: 2
  strategy: ddp_find_unused_parameters_true
  precision: bf16-mixed
  accumulate_grad_batches: 2
  detect_anomaly: true
  deterministic: true
  profiler: simple
  max_steps: 1000
model:
  class_path: my.Model
"""


def test_lightning_cli_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(LIGHTNING)
    assert sniff(path)[0] == "lightning"
    env, notes = _env(tmp_path, "config.yaml", LIGHTNING)
    assert env.framework == "lightning" and env.world_size == 8
    assert env.ddp_find_unused_parameters is True
    assert (
        env.configured_by["ddp_find_unused_parameters"]
        == "config.yaml: trainer.strategy: ddp_find_unused_parameters_true"
    )
    assert env.anomaly_detection is True and env.autocast_dtype == "bf16" and env.grad_accum_steps == 2
    assert env.total_steps == 1000
    assert any("deterministic" in n for n in notes) and any("profiler: simple" in n for n in notes)


def test_lightning_strategy_objects(tmp_path: Path) -> None:
    static = LIGHTNING.replace(
        "strategy: ddp_find_unused_parameters_true",
        "strategy:\n    class_path: lightning.pytorch.strategies.DDPStrategy\n    init_args:\n"
        "      find_unused_parameters: true\n      static_graph: true",
    )
    env, _ = _env(tmp_path, "config.yaml", static)
    assert env.ddp_find_unused_parameters is False  # a static graph skips the search
    plain = LIGHTNING.replace("strategy: ddp_find_unused_parameters_true", "strategy: ddp").replace(
        "detect_anomaly: true", "detect_anomaly: false"
    )
    env, _ = _env(tmp_path, "c2.yaml", plain)
    assert env.ddp_find_unused_parameters is None  # Lightning 2 does not search, Lightning 1 did: unread
    assert env.anomaly_detection is False


def test_a_config_alone_names_the_ddp_search(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(LIGHTNING)
    findings = {str(f.cause): f for f in diagnose(load_run(Inputs(paths=[path], configs_only=True))).findings}
    ddp = findings["ddp_find_unused"]
    assert ddp.evidence["find_unused_parameters"] is True and str(path) in ddp.evidence["config_sources"]
    assert ddp.confidence < 0.5 and ddp.est_speedup is None  # a setting, not a measurement
    debug = findings["debug_modes"]  # trainer.detect_anomaly: true, named with the setting that says it
    assert debug.evidence["anomaly_detection"] is True
    assert "detect_anomaly" in str(debug.evidence["configured_by"]) and debug.est_speedup is None


# --- logs ---------------------------------------------------------------------------------------------------


def test_ddps_own_warning_in_a_real_torchrun_log() -> None:
    path = CORPUS / "ddp_unused_search.log"
    assert sniff(path)[0] == "training_log"
    profile = load_run(Inputs(paths=[path]))
    assert [r.rank for r in profile.ranks] == [0, 1]  # torchrun's [rank0]: / [rank1]: prefixes
    for rank in profile.ranks:
        assert rank.ddp is not None and rank.ddp.find_unused_parameters is True
        assert rank.ddp.unused_parameters == 0 and rank.ddp.set_by == "DDP's own warning in the log"
        assert not rank.steps  # a log times nothing
    assert profile.environment.ddp_find_unused_parameters is True and profile.world_size == 2
    finding = next(f for f in diagnose(profile).findings if f.cause == "ddp_find_unused")
    assert finding.evidence["unused_parameters"] == 0


def test_dynamo_recompiles_and_the_limit_in_a_real_log() -> None:
    facts = read_log(CORPUS / "dynamo_recompiles.log")
    stats = facts.compile[0]
    assert stats.cache_limit_hit and stats.recompile_limit == 8
    assert stats.recompiles == 8 and stats.compiled_frames == 9  # 8 "Recompiling function" lines, frame 0
    assert stats.reasons == ["tensor 'args[0]' size mismatch at index 0"]  # one cause, not one per size
    assert stats.limit_frame is not None and stats.limit_frame.startswith("'inner' (")
    assert facts.env.anomaly_detection is True  # detect_anomaly()'s own warning, later in the same log
    assert any("hit config.recompile_limit (8)" in n for n in facts.notes)


def test_older_torch_and_lightning_lines(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "Epoch 0:  10%|#         | 10/100 [00:01<00:09, 9.50it/s, loss=2.31]\n"
        "[2024-01-01 10:00:00,000] torch._dynamo.convert_frame: [WARNING] torch._dynamo hit config.cache_size_limit (8)\n"
        "   function: 'forward' (/job/model.py:40)\n"
        "   last reason: tensor 'L['x']' size mismatch at index 1. expected 40, actual 48\n"
        'To log all recompilation reasons, use TORCH_LOGS="recompiles".\n'
        "You have turned on `Trainer(detect_anomaly=True)`. This will significantly slow down compute speed and "
        "is recommended only for model debugging.\n"
    )
    facts = read_log(path)
    stats = facts.compile[0]
    assert stats.cache_limit_hit and stats.recompile_limit == 8 and stats.recompiles == 7
    assert stats.limit_frame == "'forward' (/job/model.py:40)"
    assert stats.reasons == ["tensor 'L['x']' size mismatch at index 1"]
    assert (
        facts.env.anomaly_detection is True
        and "Trainer(detect_anomaly=True)" in facts.env.configured_by["anomaly_detection"]
    )


def test_a_log_without_these_lines_is_read_and_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "".join(
            f"{{'loss': 2.{i}, 'grad_norm': 1.0, 'learning_rate': 1e-4, 'epoch': 0.{i}}}\n" for i in range(9)
        )
    )
    profile = load_run(Inputs(paths=[path]))
    assert profile.ranks == [] and profile.environment.ddp_find_unused_parameters is None
    diagnose(profile)


def test_pitstop_check_refuses_a_log(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="not a config"):
        load_run(Inputs(paths=[CORPUS / "ddp_unused_search.log"], configs_only=True))


def test_hostile_logs_cost_bounded_time_and_memory(tmp_path: Path) -> None:
    """A 30 MB line without an end (a progress bar rewritten with \\r only counts as lines), a gzip cut short,
    a prefix with a rank beyond any job, binary noise: read to the end, each in one pass."""
    endless = tmp_path / "endless.log"
    with endless.open("w") as f:
        f.write("[rank0]:[W1206 07:11:02.69 reducer.cpp:1] Warning: " + "x" * (30 * 2**20) + "\n")
        f.write(
            "[rank99999999]:[W1206 07:11:02.69 reducer.cpp:1] Warning: find_unused_parameters=True was "
            "specified in DDP constructor, but did not find any unused parameters in the forward pass.\n"
        )
    start = time.perf_counter()
    facts = read_log(endless)
    assert time.perf_counter() - start < 30  # a hang detector, not a timing assert
    assert list(facts.ddp) == [0]  # no job has a rank 99,999,999: the line is read as unprefixed
    assert facts.lines == 2

    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress((CORPUS / "ddp_unused_search.log").read_bytes())[:-20])
    facts = read_log(cut)
    assert any("truncated or corrupt gzip" in n for n in facts.notes)

    noise = tmp_path / "noise.log"
    noise.write_bytes(
        b"[rank0]: torch._dynamo hit config.recompile_limit (" + b"9" * 5000 + b")\n\xff\xfe" * 100
    )
    assert read_log(noise).compile == {}  # a limit of 5,000 digits is not a number torch printed
    assert LINE_LIMIT < 2**20

    # lines built to make a backtracking pattern quadratic: a run of digits, a guard failure of spaces
    slow = tmp_path / "slow.log"
    slow.write_text(
        "1" * 60_000
        + "\nRecompiling function f in x.py:1\n    triggered by the following guard failure(s):\n    - "
        + " " * 8000
        + "expected"
        + " " * 8000
        + "\n"
        + "   last reason: "
        + " " * 8000
        + "\n"
    )
    start = time.perf_counter()
    facts = read_log(slow)
    sniff(slow)
    assert time.perf_counter() - start < 30  # a hang detector, not a timing assert
    assert facts.compile[0].recompiles == 1
