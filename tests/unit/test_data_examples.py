"""Reading examples: formats, layouts, and bad examples named by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pitstop.data.examples import ExampleError, ReadReport, read_examples


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_layouts(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ]
        },
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {"instruction": "add", "input": "1 2", "output": "3"},
        {"question": "2+2?", "answer": "4"},
        {"prompt": "p", "completion": "c"},
        {"text": "just text"},
    ]
    got = list(read_examples(_jsonl(tmp_path / "d.jsonl", rows)))
    assert [e.layout for e in got] == [
        "messages",
        "sharegpt",
        "alpaca",
        "prompt_completion",
        "prompt_completion",
        "text",
    ]
    assert got[1].turns == [("user", "q"), ("assistant", "a")]
    assert got[2].turns == [("user", "add\n\n1 2"), ("assistant", "3")]


def test_json_csv_parquet_and_saved_dataset(tmp_path: Path) -> None:
    rows = [{"instruction": f"i{k}", "output": f"o{k}"} for k in range(5)]
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    assert len(list(read_examples(tmp_path / "d.json"))) == 5
    (tmp_path / "d.csv").write_text("instruction,output\n" + "".join(f"i{k},o{k}\n" for k in range(5)))
    assert len(list(read_examples(tmp_path / "d.csv"))) == 5
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert len(list(read_examples(tmp_path / "d.parquet"))) == 5
    ds.save_to_disk(str(tmp_path / "saved"))
    assert [e.turns[1][1] for e in read_examples(tmp_path / "saved")] == [f"o{k}" for k in range(5)]


def test_bad_lines_are_named_or_skipped_and_counted(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "bad.jsonl",
        [
            {"text": "fine"},
            "{not json",
            {"instruction": "no output"},
            {"text": ""},
            {"messages": [{"role": "user", "content": "only a question"}]},
            {"text": "fine too"},
        ],
    )
    with pytest.raises(ExampleError, match=r"bad.jsonl:2: not valid JSON"):
        list(read_examples(path))
    report = ReadReport()
    kept = list(read_examples(path, skip_bad=True, report=report))
    assert [e.turns[0][1] for e in kept] == ["fine", "fine too"]
    assert report.skipped == 4 and "bad.jsonl:2" in (report.first_error or "")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"instruction": "x"}, "no known fields"),
        ({"text": "   "}, "empty example"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant answer"),
    ],
)
def test_each_kind_of_bad_example(tmp_path: Path, row: dict[str, object], message: str) -> None:
    with pytest.raises(ExampleError, match=message):
        list(read_examples(_jsonl(tmp_path / "one.jsonl", [row])))
