"""The SQLite file that keeps every measured result, safe for many writers at once.

Safety first: a file is inspected from its raw header before SQLite opens it, so a text file, a truncated
or foreign database, or one written by a newer pitstop is refused with a one-line ``HistoryError`` and left
exactly as it was; a history that fails SQLite's ``quick_check`` is refused the same way, before anything
is written to it. Writers (ranks, parallel jobs) share the file through WAL, a busy timeout, ``BEGIN
IMMEDIATE`` transactions and a retry loop, so none of them loses a record. Readers open the file read-only
(a history on a read-only disk or in someone else's folder is readable, WAL mode included).
"""

from __future__ import annotations

import builtins
import json
import random
import shutil
import sqlite3
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pitstop import schemas
from pitstop.history.documents import METRIC_COLUMNS, summarize
from pitstop.history.errors import HistoryError
from pitstop.history.fingerprint import (
    OLD_VERSIONS_FIELD,
    canonical_json,
    current_fields,
    fingerprint_of,
    matching_fingerprint,
    versions_of,
)
from pitstop.history.gitinfo import git_head, resolve_label
from pitstop.history.paths import resolve_path
from pitstop.regular import regular_problem

APPLICATION_ID = 0x50495453  # "PITS": marks the file as a pitstop history
BUSY_TIMEOUT_S = 30.0
MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger id would overflow the query's parameter
_MAGIC = b"SQLite format 3\x00"
_HEADER = 100

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    created_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT,
    git_commit TEXT,
    command TEXT,
    fingerprint TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    real_tokens_per_s REAL,
    tokens_per_s REAL,
    step_time_s REAL,
    mfu REAL,
    result_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_fingerprint ON runs (fingerprint, label, id)",
)
# a failed run (its document's ``failure``: the job crashed, exited non-zero or was killed) is kept and listed
# as failed, and is never the baseline another run is compared with; a damaged document counts as not failed
# (reading it by id names the damage)
_FAILED = "(json_valid(result_json) AND json_extract(result_json, '$.failure') IS NOT NULL)"
_FAILURE_COLUMN = (
    f"CASE WHEN {_FAILED} THEN coalesce(json_extract(result_json, '$.failure.summary'), '') END AS failure"
)
_SUMMARY_COLUMNS = (
    "id, created_at, kind, label, git_commit, command, fingerprint, fingerprint_json, "
    + ", ".join(METRIC_COLUMNS)
    + ", "
    + _FAILURE_COLUMN
)

T = TypeVar("T")


@dataclass
class RunRecord:
    """One stored result. ``result`` (the whole document) is loaded by ``get`` only."""

    id: int
    created_at: str
    kind: str
    label: str | None
    git_commit: str | None
    command: str | None
    fingerprint: str
    fingerprint_fields: dict[str, Any]
    real_tokens_per_s: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    mfu: float | None
    result: dict[str, Any] | None = None
    failure: str | None = None  # how the job failed, in its report's lead line; None: it did not

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def metric(self, name: str) -> float | None:
        if name not in METRIC_COLUMNS:
            raise HistoryError(f"unknown metric '{name}'; known: {', '.join(METRIC_COLUMNS)}")
        value: float | None = getattr(self, name)
        return value

    def to_dict(self, with_result: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "result"}
        if with_result:
            out["result"] = self.result
        return out

    @property
    def versions(self) -> dict[str, str]:
        """The library versions the run recorded (from its document: empty for a record listed without it)."""
        return versions_of(self.result)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> RunRecord:
        """The record of one row; a row whose JSON is damaged raises ``HistoryError`` naming it. A row written
        while versions were part of the fingerprint reads with the fingerprint it is matched by now."""
        keys = row.keys()
        fields = _json_object(row, "fingerprint_json")
        result = _json_object(row, "result_json") if "result_json" in keys else None
        return cls(
            id=row["id"],
            created_at=row["created_at"],
            kind=row["kind"],
            label=row["label"],
            git_commit=row["git_commit"],
            command=row["command"],
            fingerprint=matching_fingerprint(row["fingerprint"], fields),
            fingerprint_fields=current_fields(fields),
            real_tokens_per_s=row["real_tokens_per_s"],
            tokens_per_s=row["tokens_per_s"],
            step_time_s=row["step_time_s"],
            mfu=row["mfu"],
            result=result,
            failure=_failure_text(row["failure"]) if "failure" in keys else None,
        )


class RunList(builtins.list[RunRecord]):
    """The runs ``HistoryStore.list`` returns: a plain list that displays itself as a table in notebooks."""

    def _repr_html_(self) -> str:
        from pitstop.history.display import html_table

        def num(v: float | None, fmt: str) -> str | None:
            return None if v is None else format(v, fmt)

        rows = [
            [f"#{r.id}", r.created_at[:19], f"{r.kind}, failed" if r.failed else r.kind, r.label,
             num(r.real_tokens_per_s, ",.0f"),
             num(r.tokens_per_s, ",.0f"), num(r.step_time_s, ".3g"), num(r.mfu, ".1%")]
            for r in self
        ]  # fmt: skip
        head = ["run", "when", "kind", "label", "real tokens/s", "tokens/s", "s/step", "MFU"]
        return html_table(head, rows, caption=f"pitstop history: {len(self)} runs", right_from=4)


def _failure_text(value: Any) -> str | None:
    """A stored run's failure as a line (its document's ``failure.summary``), None for a run that did not fail;
    a failed run whose document says no more reads "failed"."""
    if value is None:
        return None
    return value if isinstance(value, str) and value else "failed"


def _json_object(row: sqlite3.Row, column: str) -> dict[str, Any]:
    try:
        value = json.loads(row[column])
    except (TypeError, ValueError) as exc:
        raise HistoryError(f"run #{row['id']} is damaged: its {column} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise HistoryError(f"run #{row['id']} is damaged: its {column} is not a JSON object")
    return value


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _retry(action: Callable[[], T], timeout: float = BUSY_TIMEOUT_S) -> T:
    """Run ``action``, again after a short random pause while another writer holds the lock."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.25)


def _header_problem(path: Path) -> str | None:
    """Why the raw bytes of ``path`` cannot be a pitstop history, or ``None``. Reads; never writes."""
    with path.open("rb") as f:
        header = f.read(_HEADER)
    size = path.stat().st_size
    if not header:
        return None  # an empty file: a new history
    if len(header) < _HEADER or not header.startswith(_MAGIC):
        return "not an SQLite database"
    app_id, user_version = struct.unpack(">I", header[68:72])[0], struct.unpack(">I", header[60:64])[0]
    schema_cookie = struct.unpack(">I", header[40:44])[0]
    if app_id not in (0, APPLICATION_ID) or (app_id == 0 and schema_cookie != 0):
        return "an SQLite database of another program, not a pitstop history"
    if app_id == APPLICATION_ID and user_version > schemas.HISTORY_DB_VERSION:
        return _too_new(user_version)
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    pages, change, valid_for = struct.unpack(">I", header[28:32])[0], header[24:28], header[92:96]
    busy = any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))
    if pages and change == valid_for and not busy and size < pages * page_size:
        return f"truncated or corrupt SQLite file ({size} bytes; its header says {pages * page_size})"
    return None


def _describe(path: Path, exc: sqlite3.DatabaseError) -> str:
    if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
        return f"{path}: still locked by another process after {BUSY_TIMEOUT_S:.0f} s ({exc})"
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError) and ("readonly" in text or "unable to open" in text):
        return (
            f"{path}: cannot be written here ({exc}): a read-only disk or another user's folder; "
            "record elsewhere with --history PATH, or pass --no-history"
        )
    return f"{path}: not a usable pitstop history ({exc}); left untouched"


def _too_new(version: int) -> str:
    return (
        f"written by a newer pitstop (history schema {version}; this one reads up to {schemas.HISTORY_DB_VERSION}); "
        "upgrade pitstop or use another --history"
    )


def _check_file(path: Path) -> None:
    """Refuse, before anything opens it, what is not a regular file: a FIFO would block the open forever
    (the trace readers' own check), a folder or device is no history."""
    if path.is_dir():
        raise HistoryError(f"{path}: is a folder, not a history file")
    problem = regular_problem(path, empty_ok=True)
    if problem is not None:
        raise HistoryError(f"{problem}; left untouched")
    for attempt in range(3):
        problem = _header_problem(path)
        if problem is None:
            return
        if "truncated" not in problem or attempt == 2:
            raise HistoryError(f"{path}: {problem}; left untouched")
        time.sleep(0.05)  # a writer may be extending the file right now: look again


def _integrity_problem(conn: sqlite3.Connection) -> str | None:
    """SQLite's ``quick_check`` (pages, cells, free list: O(file size)), as one line, or ``None``."""
    rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
    if rows == ["ok"]:
        return None
    text = " ".join(" ".join(rows).replace("*** in database main ***", "").split())
    return text if len(text) <= 160 else text[:159] + "…"


def _probe(conn: sqlite3.Connection) -> sqlite3.Connection:
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def _connect(path: Path, readonly: bool) -> tuple[sqlite3.Connection, Path | None]:
    """A connection (and a private copy's folder to remove on close, if one was needed).

    Reading first opens the file as writing does (closing it then leaves no ``-wal``/``-shm`` behind).
    Where that fails because the folder is read-only (WAL needs its ``-shm`` file), it opens ``mode=ro``
    (works when ``-shm`` exists), then ``immutable`` when no WAL content is pending; a history with pending
    WAL content is copied (with its WAL) to a private folder and read there, so no committed run is missed.
    """
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    if not readonly:
        return conn, None
    try:
        return _probe(conn), None
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise
    uri = path.resolve().as_uri()
    try:
        return _probe(
            sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        ), None
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise
    wal = Path(f"{path}-wal")
    if not (wal.is_file() and wal.stat().st_size > 0):
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None), None
    copy = Path(tempfile.mkdtemp(prefix="pitstop-history-"))
    try:
        shutil.copyfile(path, copy / path.name)
        shutil.copyfile(wal, copy / wal.name)
        return sqlite3.connect(copy / path.name, timeout=BUSY_TIMEOUT_S, isolation_level=None), copy
    except BaseException:
        shutil.rmtree(copy, ignore_errors=True)
        raise


def _identity(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """``(application_id, user_version, schema objects)``, read from one snapshot."""
    own = not conn.in_transaction
    if own:  # one read transaction: another process may initialise the file between two reads
        conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")
    return app_id, version, objects


class HistoryStore:
    """A pitstop history file. ``create=False`` opens for reading: a missing file reads as empty."""

    def __init__(self, path: Path | str | None = None, *, create: bool = True) -> None:
        self.path = resolve_path(path)
        self._conn: sqlite3.Connection | None = None
        self._writes = create
        self._copy: Path | None = None
        exists = self.path.exists()
        if exists:
            _check_file(self.path)
        elif not create:
            return
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"{self.path}: cannot create its folder ({exc.strerror or exc})") from None
        try:
            conn, self._copy = _connect(self.path, readonly=not create)
        except (sqlite3.Error, OSError) as exc:
            raise HistoryError(f"{self.path}: cannot open ({exc})") from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            ready = self._prepare(conn, create)
        except sqlite3.DatabaseError as exc:
            self._close(conn)
            raise HistoryError(_describe(self.path, exc)) from None
        except BaseException:
            self._close(conn)
            raise
        if ready:
            self._conn = conn
        else:
            self._close(conn)

    def _prepare(self, conn: sqlite3.Connection, create: bool) -> bool:
        """Check what the file is; initialise an empty one when writing. True when it holds a history."""

        def verify(app_id: int, version: int, objects: int) -> bool:
            if app_id == APPLICATION_ID:
                if version > schemas.HISTORY_DB_VERSION:
                    raise HistoryError(f"{self.path}: {_too_new(version)}")
                return version == schemas.HISTORY_DB_VERSION
            if objects:
                raise HistoryError(
                    f"{self.path}: an SQLite database of another program, not a pitstop history; left untouched"
                )
            return False

        if verify(*_retry(lambda: _identity(conn))):
            problem = _retry(lambda: _integrity_problem(conn))  # before anything is written to it
            if problem is not None:
                raise HistoryError(
                    f"{self.path}: fails SQLite's integrity check ({problem}); left untouched: move it aside "
                    f"to start a new history (`sqlite3 {self.path} .recover` can save its rows)"
                )
            if create:
                self._use_wal(conn)
            return True
        if not create:
            return False

        def initialise() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if not verify(*_identity(conn)):  # another process may have won the race
                    for statement in _SCHEMA:  # one by one: executescript would commit early
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version = {schemas.HISTORY_DB_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        _retry(initialise)
        self._use_wal(conn)
        return True

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        """WAL lets readers and one writer work at once; the mode stays with the file."""
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            _retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        conn.execute(
            "PRAGMA synchronous = NORMAL"
        )  # with WAL: never corrupt; a power cut may drop the last commit

    # -- writing ------------------------------------------------------------------------------------

    def add(
        self, result: dict[str, Any], kind: str, label: str | None = None, cwd: Path | None = None
    ) -> int:
        """Store ``result`` and return its run id. ``label``: see ``resolve_label``."""
        if not kind or not isinstance(kind, str):
            raise HistoryError("a recorded run needs a kind (doctor, tune, analyze, demo, …)")
        summary = summarize(result)
        conn = self._writable()
        _, commit = git_head(cwd)
        values = (
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
            kind,
            resolve_label(label, cwd),
            commit,
            summary.command,
            fingerprint_of(summary.fingerprint_fields),
            canonical_json(summary.fingerprint_fields),
            *(summary.metrics[name] for name in METRIC_COLUMNS),
            json.dumps(result, default=str),
        )
        sql = (
            "INSERT INTO runs (created_at, kind, label, git_commit, command, fingerprint, fingerprint_json, "
            f"{', '.join(METRIC_COLUMNS)}, result_json) VALUES ({', '.join('?' * len(values))})"
        )

        def insert() -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row_id = conn.execute(sql, values).lastrowid
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            assert row_id is not None
            return row_id

        return self._guard(lambda: _retry(insert))

    def _writable(self) -> sqlite3.Connection:
        if self._conn is None or not self._writes:
            raise HistoryError(f"{self.path}: opened for reading only")
        return self._conn

    def _guard(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            raise HistoryError(_describe(self.path, exc)) from None

    # -- reading ------------------------------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> builtins.list[sqlite3.Row]:
        conn = self._conn
        if conn is None:
            return []
        return self._guard(lambda: _retry(lambda: conn.execute(sql, params).fetchall()))

    def list(self, limit: int | None = 20, kind: str | None = None, label: str | None = None) -> RunList:
        """The newest runs first, optionally only one kind or label."""
        where, params = self._filters(kind=kind, label=label)
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM runs{where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params += (min(limit, MAX_ID),)  # more than SQLite can count is all of them
        return RunList(self._record(r) for r in self._query(sql, params))

    def get(self, run_id: int) -> RunRecord | None:
        """One run with its whole document, or ``None`` (an id beyond SQLite's 64-bit integers included)."""
        if not 0 <= run_id <= MAX_ID:
            return None
        rows = self._query(f"SELECT {_SUMMARY_COLUMNS}, result_json FROM runs WHERE id = ?", (run_id,))
        return self._record(rows[0]) if rows else None

    def _record(self, row: sqlite3.Row) -> RunRecord:
        try:
            return RunRecord.from_row(row)
        except HistoryError as exc:
            raise HistoryError(f"{self.path}: {exc}") from None

    def latest(
        self,
        kind: str | None = None,
        label: str | None = None,
        fingerprint: str | None = None,
        exclude: int | None = None,
        include_failed: bool | None = None,
    ) -> RunRecord | None:
        """The most recent run matching every given filter (with its document), or ``None``. A row written
        while versions were part of the fingerprint matches by its fields without them. ``include_failed``:
        whether a run whose job failed may be the answer; by default not when a fingerprint is asked for
        (the run found is a baseline others are compared with, and a failed run never is), else yes."""
        where, params = self._filters(kind=kind, label=label)
        if exclude is not None:
            where += (" AND" if where else " WHERE") + " id != ?"
            params += (exclude,)
        if include_failed is False or (include_failed is None and fingerprint is not None):
            where += (" AND" if where else " WHERE") + f" NOT {_FAILED}"
        if fingerprint is None:
            rows = self._query(f"SELECT id FROM runs{where} ORDER BY id DESC LIMIT 1", params)
            return self.get(rows[0]["id"]) if rows else None
        joiner = " AND" if where else " WHERE"
        rows = self._query(
            f"SELECT id FROM runs{where}{joiner} fingerprint = ? ORDER BY id DESC LIMIT 1",
            (*params, fingerprint),
        )
        newest = rows[0]["id"] if rows else None
        # rows of the older format, newer than the newest match of the new one (few: only an old history has them)
        old = f"{joiner} instr(fingerprint_json, ?) > 0" + ("" if newest is None else " AND id > ?")
        old_params = (*params, f'"{OLD_VERSIONS_FIELD}":', *(() if newest is None else (newest,)))
        for row in self._query(
            f"SELECT id, fingerprint, fingerprint_json FROM runs{where}{old} ORDER BY id DESC", old_params
        ):
            try:
                stored = json.loads(row["fingerprint_json"])
            except ValueError:
                continue  # a damaged row matches nothing; reading it by id names it
            if isinstance(stored, dict) and matching_fingerprint(row["fingerprint"], stored) == fingerprint:
                newest = row["id"]
                break
        return None if newest is None else self.get(newest)

    def count(self) -> int:
        rows = self._query("SELECT count(*) FROM runs")
        return int(rows[0][0]) if rows else 0

    @staticmethod
    def _filters(**values: str | None) -> tuple[str, tuple[Any, ...]]:
        used = {k: v for k, v in values.items() if v is not None}
        if not used:
            return "", ()
        return " WHERE " + " AND ".join(f"{k} = ?" for k in used), tuple(used.values())

    # -- lifetime -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._conn is not None:
            self._close(self._conn)
            self._conn = None

    def _close(self, conn: sqlite3.Connection) -> None:
        conn.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(path: Path | str | None = None, *, create: bool = True) -> HistoryStore:
    """The history at ``path`` (default: ``default_path()``); use it as a context manager."""
    return HistoryStore(path, create=create)
