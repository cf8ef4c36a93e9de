"""Output paths (issue 25 item 1): ``--json`` / ``--html`` never replace what sits at the path.

``-`` is standard output; a device node or FIFO is written in place (never replaced by a regular file, which
as root would replace ``/dev/null`` for the whole machine); a link is written where it points and stays a
link; a folder is refused in one line with exit 2 before anything runs. Every special file is made in the
test's own temporary folder (``os.mkfifo``; as root ``os.mknod`` with ``/dev/null``'s numbers): the real
``/dev`` is never touched. The CLI runs in-process (``main()``), as a user would call it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from tests.inprocess import cli

from pitstop.atomic import target_kind, write_atomic
from pitstop.cli.errors import UserError
from pitstop.cli.outputs import Outputs

SMI = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n" + "".join(
    f"2024/01/01 10:00:{s:02d}.000, 0, NVIDIA H100 80GB HBM3, {40 + s} %, 1000 MiB, 81559 MiB\n"
    for s in range(10)
)


@pytest.fixture
def smi(tmp_path: Path) -> Path:
    path = tmp_path / "gpu.csv"
    path.write_text(SMI)
    return path


def test_dash_is_standard_output_and_the_report_goes_to_stderr(
    smi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, monkeypatch, "analyze", str(smi), "--json", "-")
    assert code == 0, err
    assert json.loads(out)["schema"] == "pitstop.run/1"  # stdout holds the document alone
    assert "pitstop analyze" in err  # the human report moved to stderr
    assert not (tmp_path / "-").exists()  # no file named '-'


def test_a_symlink_is_written_where_it_points_and_stays_a_link(
    smi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "out" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    code, _, err = cli(capsys, monkeypatch, "analyze", str(smi), "--json", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["schema"] == "pitstop.run/1"
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.json"]  # no temporary left behind


def test_a_dangling_link_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    write_atomic(link, "{}")
    assert link.is_symlink() and (tmp_path / "target.json").read_text() == "{}"


def test_a_fifo_is_written_in_place_not_replaced(
    smi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = cli(capsys, monkeypatch, "analyze", str(smi), "--json", str(fifo))
    reader.join(timeout=30)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still a FIFO
    assert json.loads(got[0])["schema"] == "pitstop.run/1"  # the reader at the other end got the document


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_written_in_place_as_root(
    smi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.stat("/dev/null")  # only its numbers are read; the node is made in tmp_path
    null = real.st_rdev if stat.S_ISCHR(real.st_mode) else os.makedev(1, 3)  # Linux's null device
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, null)
    try:
        os.close(os.open(node, os.O_WRONLY))
    except OSError as exc:  # a sandbox or a nodev mount: the node exists but cannot be opened
        pytest.skip(f"a device node made here cannot be opened ({exc.strerror})")
    code, _, err = cli(capsys, monkeypatch, "analyze", str(smi), "--json", str(node), "--html", str(node))
    assert code == 0, err
    info = node.lstat()
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == null  # the same device, not a 5 kB regular file
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_folder_is_refused_with_exit_2_before_anything_runs(
    smi: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "out.json"
    folder.mkdir()
    code, out, err = cli(capsys, monkeypatch, "analyze", str(smi), "--json", str(folder), "--no-history")
    assert code == 2
    assert err.strip().splitlines() == [f"pitstop: --json {folder}: is a folder; give a file name"]
    assert "pitstop analyze" not in out  # refused before the run was read and reported
    with pytest.raises(UserError) as refused:
        Outputs(html=folder).check()  # doctor / watch / tune call the same check before starting the job
    assert refused.value.code == 2


def test_write_atomic_refuses_a_folder_and_names_the_special_kinds(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path, "x")
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert (target_kind(tmp_path), target_kind(fifo), target_kind(tmp_path / "none")) == (
        "folder",
        "special",
        "missing",
    )


def test_a_regular_file_is_still_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")
    before = target.stat().st_ino
    write_atomic(target, "new")
    assert target.read_text() == "new" and target.stat().st_ino != before  # renamed over, not rewritten


def test_plan_json_to_stdout(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli(
        capsys, monkeypatch, "plan", "--model", "llama-3.2-1b", "--no-simulate", "--json", "-"
    )
    assert code == 0, err
    assert "Memory per GPU" in err  # the table went to stderr
    assert json.loads(out)["schema"].startswith("pitstop.plan/")
