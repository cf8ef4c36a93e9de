"""Every snippet pitstop prints for a framework works against that framework's real code.

For each remedy in the registry, each framework it writes advice for and each representative set of params
(``tests/snippets/params.py``, one per branch of its snippet):

* fast: the snippet is split into its Python, shell, ds_config (JSON) and accelerate-config (YAML) parts; the
  Python parses, uses only names it defines or a job of that framework has, and every keyword argument and
  attribute exists in the installed API (``inspect.signature``); the JSON parses and DeepSpeed's own config
  model accepts its ZeRO section; the YAML's keys are ``accelerate config``'s;
* slow: the Python runs inside a tiny real job of the framework (``tests/snippets/jobs.py``), which then trains
  two steps with what the snippet changed; the ds_config drives DeepSpeed's engine on CPU; shell lines pass
  ``bash -n``.
"""

from __future__ import annotations

import ast
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.snippets.harness import Report, StaticChecker, check_snippet, segments
from tests.snippets.params import PARAMS, cases

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies import REGISTRY

# remedies whose snippets another piece of work is rewriting (issue 42's padding family): not checked here yet
OWNED_ELSEWHERE: dict[RemedyId, str] = {}
# the model a remedy's job trains: the experts remedies need a mixture-of-experts model
MODEL_KIND = {RemedyId.GROUPED_EXPERTS: "mixtral", RemedyId.PIN_VERSIONS: "mixtral"}


def all_cases() -> Iterator[Any]:
    for remedy_id, remedy in REGISTRY.items():
        for index in range(len(cases(remedy_id))):
            for framework in remedy.frameworks():
                marks = (
                    [pytest.mark.skip(reason=OWNED_ELSEWHERE[remedy_id])]
                    if remedy_id in OWNED_ELSEWHERE
                    else []
                )
                yield pytest.param(
                    remedy_id, index, framework, id=f"{remedy_id}-{index}-{framework}", marks=marks
                )


CASES = sorted(all_cases(), key=lambda p: str(p.values[2]))  # one framework's cases together


def snippet_of(remedy_id: RemedyId, index: int, framework: Framework) -> str:
    return REGISTRY[remedy_id].advice(framework, cases(remedy_id)[index]).snippet


# ---------------------------------------------------------------- fast: parsed and checked against the API


@pytest.mark.parametrize(("remedy_id", "index", "framework"), CASES)
def test_snippet_matches_the_real_api(remedy_id: RemedyId, index: int, framework: Framework) -> None:
    report, _ = check_snippet(snippet_of(remedy_id, index, framework), framework)
    assert not report.problems, "\n".join(report.problems)


def test_params_name_what_each_advice_reads() -> None:
    """A representative param no advice docstring mentions is a typo that would test a branch never taken."""
    for remedy_id, param_sets in PARAMS.items():
        doc = REGISTRY[remedy_id].advice.__doc__ or ""
        source = Path(
            __import__(type(REGISTRY[remedy_id]).__module__, fromlist=["x"]).__file__ or ""
        ).read_text()
        for params in param_sets:
            unknown = [k for k in params if f"``{k}``" not in doc and f'"{k}"' not in source]
            assert not unknown, f"{remedy_id}: {unknown} read by no advice"


def test_the_checker_catches_what_would_break_a_job() -> None:
    """The harness itself: a wrong keyword, a removed attribute, an undefined name, a bad hook, bad JSON, a key
    accelerate config does not have, each fails; the right ones pass."""
    bad = {
        'args = TrainingArguments(..., evaluation_strategy="steps")': "evaluation_strategy=",
        "trainer = L.Trainer(..., gpus=2)": "gpus=",
        'trainer = L.Trainer(..., precision="fp16-mixed")': "precision='fp16-mixed'",
        "loader = DataLoader(train, batch_size=8, ...)": "does not parse",
        "loader = DataLoader(train, ..., num_worker=4)": "num_worker=",
        "torch.backends.cuda.matmul.no_such_flag = True": "no_such_flag",
        "loader = DataLoader(train, collate_fn=pad_batch)": "'pad_batch'",
        "class C(TrainerCallback):\n    def on_step_end(self, state):\n        pass": "on_step_end",
        '"zero_optimization": {"stage": 3,  # a comment\n "overlap_comm": true}': "not JSON",
        '"zero_optimization": {"stage": 3, "overlap_com": true}': "overlap_com",
        "distributed_type: MULTI_GPUS": "MULTI_GPUS",
        "fsdp_sharding_strategys: FULL_SHARD": "fsdp_sharding_strategys",
        "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 'two train.py": "shell",
    }
    for snippet, named in bad.items():
        framework = Framework.LIGHTNING if "L.Trainer" in snippet else Framework.HF_TRAINER
        report, _ = check_snippet(snippet, framework)
        assert any(named in p for p in report.problems), f"{snippet!r} passed: {report.problems}"
    good = 'args = TrainingArguments(..., eval_strategy="steps")\ntrainer = Trainer(..., callbacks=[])'
    assert not check_snippet(good, Framework.HF_TRAINER)[0].problems


def test_snippet_parts_are_told_apart() -> None:
    snippet = (
        "# accelerate config:\ndistributed_type: MULTI_GPU\n"
        'export NCCL_DEBUG=INFO\nargs = TrainingArguments(\n    ...,\n    tf32=True,\n)\n"bf16": {"enabled": true}'
    )
    kinds = [(p.kind, p.text.splitlines()[0]) for p in segments(snippet)]
    assert kinds == [
        ("yaml", "distributed_type: MULTI_GPU"),
        ("shell", "export NCCL_DEBUG=INFO"),
        ("python", "args = TrainingArguments("),
        ("json", '"bf16": {"enabled": true}'),
    ]
    report = Report()
    StaticChecker(Framework.PYTORCH).check("model = DDP(model, <your buckets>)", report)
    assert report.problems == []  # the placeholder is filled before parsing


# ---------------------------------------------------------------- slow: run inside each framework's tiny job


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Framework, Any]]:
    """Each framework's tiny job, built on first use, once for this module (one gloo process group for DDP)."""
    import torch
    import torch.distributed as dist
    from tests.snippets.jobs import JOBS, build_pieces, free_port

    pieces = build_pieces(tmp_path_factory.mktemp("snippet-jobs"))
    # the whole environment comes back after: DeepSpeed's init sets LOCAL_RANK, RANK, WORLD_SIZE, ... and a
    # later test's job in this worker would take itself for one rank of a distributed run
    saved = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    threads = torch.get_num_threads()
    built: dict[Framework, Any] = {}

    class Lazy(dict[Framework, Any]):
        def __missing__(self, framework: Framework) -> Any:
            built[framework] = JOBS[framework](pieces)
            return built[framework]

    yield Lazy()
    torch.set_num_threads(threads)
    dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.slow
@pytest.mark.parametrize(("remedy_id", "index", "framework"), CASES)
def test_snippet_runs_in_its_framework(
    remedy_id: RemedyId,
    index: int,
    framework: Framework,
    jobs: dict[Framework, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from tests.snippets.jobs import STEPS, restore_process_state, snippet_parts

    parts = snippet_parts(snippet_of(remedy_id, index, framework))
    python = "\n".join(parts["python"])
    runnable = python.strip() and any(not isinstance(s, ast.Pass) for s in ast.parse(python).body)
    if not runnable and not parts["json"]:
        pytest.skip("no Python or ds_config in this snippet (its shell lines: test_shell_lines_parse)")
    threads = torch.get_num_threads()
    monkeypatch.chdir(jobs[framework].pieces.root / "work")  # where the job's data files are
    try:
        if runnable:
            outcome = jobs[framework].run(python, MODEL_KIND.get(remedy_id, "llama"))
            everything_skipped = not any(
                not isinstance(s, ast.Pass) for s in ast.parse(outcome.ran[0]).body if s is not None
            )
            if everything_skipped and outcome.not_run:
                pytest.skip("needs a GPU: " + "; ".join(outcome.not_run))
            assert outcome.steps == STEPS, f"the job trained {outcome.steps} steps after the snippet"
        if parts["json"]:
            run_ds_config(parts["json"], jobs)
    finally:
        restore_process_state(threads)


def run_ds_config(texts: list[str], jobs: dict[Framework, Any]) -> None:
    """DeepSpeed's config object takes the merged fragments, and its engine trains on them where CPU can."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from tests.snippets.jobs import STEPS, deepspeed_config, run_deepspeed

    report = Report()
    config = deepspeed_config(texts, report)
    assert config is not None, report.problems
    DeepSpeedConfig(config)  # DeepSpeed's own parsing: every section, every field
    gpu_only = [k for k in ("fp16",) if config.get(k, {}).get("enabled")]
    zero = config.get("zero_optimization", {})
    if zero.get("zero_quantized_weights") or zero.get("zero_hpz_partition_size", 1) > 1:
        gpu_only.append("ZeRO++ (quantized / hierarchical partitions)")
    if gpu_only:
        return  # parsed by DeepSpeed above; its engine needs a GPU for these
    job = jobs[Framework.PYTORCH]
    model = job.pieces.model()
    ns_batch = job.namespace("llama", "")["batch"]
    assert run_deepspeed(config, model, ns_batch) == STEPS


@pytest.mark.slow
def test_shell_lines_parse() -> None:
    """``bash -n`` on every shell part of every snippet (placeholders filled)."""
    failures = []
    for param in CASES:
        remedy_id, index, framework = param.values
        if remedy_id in OWNED_ELSEWHERE:
            continue
        for part in segments(snippet_of(remedy_id, index, framework)):
            if part.kind == "shell":
                done = subprocess.run(["bash", "-n"], input=part.text, capture_output=True, text=True)
                if done.returncode:
                    failures.append(f"{remedy_id} [{framework}]: {part.text!r}: {done.stderr.strip()}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_the_jobs_fail_snippets_that_break_them(
    jobs: dict[Framework, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness is not a formality: issue 42's snippet (a Seq2Seq collator on causal-LM rows that carry no
    labels) ends the Trainer job as it ended the user's, and a Lightning fragment that drops the job's own
    Trainer arguments is named."""
    monkeypatch.chdir(jobs[Framework.HF_TRAINER].pieces.root / "work")
    broken = (
        "from transformers import DataCollatorForSeq2Seq\n"
        "train = raw.map(tokenize, batched=True, remove_columns=raw.column_names)\n"
        'trainer = Trainer(..., train_dataset=train, data_collator=DataCollatorForSeq2Seq(tokenizer, padding="longest"))'
    )
    with pytest.raises(ValueError, match="did not return a loss"):
        jobs[Framework.HF_TRAINER].run(broken)
    with pytest.raises(AssertionError, match="drops the job's own arguments"):
        jobs[Framework.LIGHTNING].run('L.Trainer(strategy="ddp")')
    outcome = jobs[Framework.PYTORCH].run("opt = torch.optim.AdamW(model.parameters(), lr=..., fused=True)")
    assert outcome.steps == 2 and not outcome.not_run  # lr=... took the job's own learning rate
