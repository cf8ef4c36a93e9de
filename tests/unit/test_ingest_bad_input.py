"""Hostile and odd inputs: a stated limitation or a one-line IngestError, never anything else.

The files in tests/corpus are the kept corpus (truncated gzip, invalid JSON, negative durations, a YAML
alias bomb, a decimal-comma CSV, a pickle, a CSV behind a .json.gz name, ...); the property tests feed the
parsers generated inputs on top of it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitstop.artifacts import IngestError
from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run

CORPUS = Path(__file__).resolve().parents[1] / "corpus"

EXPECTED = {
    "bomb.yaml": "alias bomb",
    "comma_locale.csv": "decimal-comma",
    "empty.json": "empty",
    "invalid.json": "invalid JSON",
    "list.json": "not a trace",
    "noheader_nounits.csv": "noheader and nounits",
    "not_a_config.yaml": "does not recognize",
    "training_args.bin": "never unpickles",
    "truncated.json.gz": "truncated",
}


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.iterdir()))
def test_corpus(name: str) -> None:
    path = CORPUS / name
    if name in EXPECTED:
        with pytest.raises(IngestError) as err:
            load_run(Inputs(paths=[path]))
        message = str(err.value)
        assert EXPECTED[name] in message and "\n" not in message
        return
    profile = load_run(Inputs(paths=[path]))  # readable, with what it could not use said
    diagnose(profile)
    if name == "negative_and_overlap.json":
        assert any("negative durations" in n for n in profile.notes)
        assert any("without a usable timestamp" in n for n in profile.notes)
        rank = profile.ranks[0]
        assert [s.index for s in rank.steps] == [
            1
        ]  # a trailing step without GPU work is dropped, as the plugin does
        assert rank.trace is not None and rank.trace.gpu_util == pytest.approx(40 / 100)
    if name == "no_steps_trace.json":
        assert any("no ProfilerStep" in n for n in profile.notes)
    if name == "csv_named_json.json.gz":
        assert profile.ranks[0].gpu_samples[0].util == 50  # read by content, not by name


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="no such file"):
        load_run(Inputs(paths=[tmp_path / "missing.json"]))
    with pytest.raises(IngestError, match="empty folder"):
        load_run(Inputs(paths=[tmp_path]))


def test_check_refuses_run_artifacts(shared_data: Path) -> None:
    trace = next((shared_data / "traces").glob("*.gz"))
    with pytest.raises(IngestError, match="not a config"):
        load_run(Inputs(paths=[trace], configs_only=True))


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**9), st.floats(allow_nan=False), st.text(max_size=12)
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "s", "f", "M", "B"]),
        "cat": st.sampled_from(
            [
                "kernel",
                "cpu_op",
                "cuda_runtime",
                "gpu_memcpy",
                "gpu_memset",
                "user_annotation",
                "Kernel",
                "python_function",
                "odd",
            ]
        ),
        "name": st.one_of(
            st.sampled_from(
                [
                    "ProfilerStep#1",
                    "ProfilerStep#2",
                    "aten::mm",
                    "ncclKernel_AllReduce",
                    "Memcpy HtoD (Pageable -> Device)",
                    "cudaStreamSynchronize",
                    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                ]
            ),
            st.text(max_size=10),
        ),
        "ts": _scalar,
        "dur": _scalar,
        "pid": _scalar,
        "tid": _scalar,
        "args": st.one_of(
            _scalar,
            st.dictionaries(
                st.sampled_from(["stream", "device", "correlation", "External id", "bytes", "Input type"]),
                _scalar,
                max_size=4,
            ),
        ),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.one_of(_event, _scalar), max_size=40), gz=st.booleans())
def test_fuzz_traces(tmp_path: Path, events: list[object], gz: bool) -> None:
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(data) if gz else data)
    try:
        diagnose(load_run(Inputs(paths=[path])))
    except IngestError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.lists(
            st.one_of(
                st.sampled_from(
                    [
                        "50 %",
                        "1024 MiB",
                        "33.5 W",
                        "[N/A]",
                        "0",
                        "",
                        "GPU-1",
                        "2026/01/03 10:00:00.000",
                        "NVIDIA H100",
                    ]
                ),
                st.text(max_size=6),
            ),
            min_size=1,
            max_size=6,
        ),
        max_size=30,
    ),
    header=st.sampled_from(
        ["timestamp, index, utilization.gpu [%], memory.used [MiB]", "utilization.gpu", ""]
    ),
)
def test_fuzz_nvidia_smi(tmp_path: Path, lines: list[list[str]], header: str) -> None:
    text = (header + "\n" if header else "") + "\n".join(", ".join(cells) for cells in lines)
    path = tmp_path / "log.csv"
    path.write_text(text)
    try:
        diagnose(load_run(Inputs(paths=[path])))
    except IngestError as exc:
        assert "\n" not in str(exc)


_config_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_config_keys = st.sampled_from(
    [
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "bf16",
        "fp16",
        "tf32",
        "packing",
        "sample_packing",
        "deepspeed",
        "zero_optimization",
        "micro_batch_size",
        "sequence_len",
        "flash_attn",
        "attn_implementation",
        "eval_steps",
        "save_steps",
        "mixed_precision",
        "num_processes",
        "distributed_type",
        "fsdp_config",
        "dataloader_num_workers",
        "output_dir",
        "learning_rate",
        "stage",
        "cutoff_len",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.dictionaries(_config_keys, _config_value, max_size=10), as_yaml=st.booleans())
def test_fuzz_configs(tmp_path: Path, config: dict[str, object], as_yaml: bool) -> None:
    import yaml

    path = tmp_path / ("c.yaml" if as_yaml else "c.json")
    path.write_text(yaml.safe_dump(config) if as_yaml else json.dumps(config))
    try:
        diagnose(load_run(Inputs(paths=[path], configs_only=True)))
    except IngestError as exc:
        assert "\n" not in str(exc)
