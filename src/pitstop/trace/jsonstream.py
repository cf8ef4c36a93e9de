"""The ``traceEvents`` array of a (possibly gzipped) Kineto trace, in batches of parsed events, with bounded
memory and cost on any input.

Why not a streaming parser per event: profiling ``pitstop analyze`` showed the per-event parser (ijson) at
~80% of the time. The text read so far is cut after the last comma between two items of the event array,
found by one pass over the bytes that keeps the state a boundary needs (in a string or not, nesting depth;
boundaries.py, in C where built), so the cut never depends on the layout: Kineto's one event per line, one
line (``json.dump``'s output, which the earlier cut at ``},\\n`` read value by value, quadratically), any
indent, CRLF, a BOM, Trace Event Format's bare array of events, gzip members cut mid-event. A chunk so cut
is exactly a run of whole events, decoded as one array: a caller's ``fast`` decoder (events.py passes
msgspec's, see fastevents.py) takes it first, as bytes; where it declines, the C ``json`` decoder builds a
few thousand events per call. A chunk that does not parse (invalid JSON) is read value by value with
``raw_decode``, which is exact for any valid JSON and says what is wrong. Both paths give the same objects
as any JSON parser (ints stay ints, other numbers are floats).

Why bytes: decoding the text to ``str`` cost as much as inflating it (~1 s per GiB). The bytes are checked
to be UTF-8 as they come (``isascii`` for the usual all-ASCII trace) and only what the stdlib decoder reads
is decoded: a declined chunk, or a window around one value.

Limits, each ending in one ``IngestError`` line: one event (or other top-level value) at most
``MAX_VALUE`` bytes (a 200 MB kernel name), nesting within ``MAX_DEPTH`` inside the event array (the
scan's count; elsewhere the interpreter's recursion limit, about 1,000; a Kineto event nests 3 deep), at most ``MAX_RATIO`` times more text than gzip bytes once past
``RATIO_FLOOR`` (a gzip bomb), and no ``NaN`` / ``Infinity`` literals (not JSON).
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

from pitstop.artifacts import GZIP_MAGIC, IngestError
from pitstop.trace.boundaries import OUT_OF_STRING, scanner

READ_BYTES = 1 << 20  # decompressed bytes per read (~3,000 Kineto events): larger saves no time
MAX_VALUE = 32 << 20  # bytes in one event or top-level value
FIRST_WINDOW = 4096  # bytes decoded around a value read on its own, widened while it does not fit
MAX_RATIO = 200  # decompressed / compressed; Kineto JSON gzips 10-25x, deflate's ceiling is ~1,030x
RATIO_FLOOR = 64 << 20  # the ratio is checked once this much text came out
MAX_DEPTH = 512  # nesting of arrays and objects inside the event array; a Kineto event nests 3 deep
BOM = codecs.BOM_UTF8  # some editors and Windows tools start a UTF-8 file with it
_WS = re.compile(rb"[ \t\n\r]*")
Fast = Callable[[memoryview], "list[Any] | None"]


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


MAX_INT_DIGITS = 40  # a profiler writes ids and nanoseconds in at most 20 digits; Python refuses past 4300


class _HugeInteger(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise _HugeInteger(len(text))
    return int(text)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_int=_parse_int)


class _Counting:
    """The raw file under gzip, counting the compressed bytes consumed (for the bomb ratio)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.consumed = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.consumed += len(data)
        return data

    def readinto(self, buffer: Any) -> int:  # what isal's reader calls
        n: int = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.consumed += n
        return n

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()


def _gzip_reader(fileobj: Any) -> tuple[Any, tuple[type[BaseException], ...]]:
    """A gzip reader over ``fileobj`` and the errors a truncated or corrupt stream raises.

    ISA-L's inflate (the ``isal`` package) is ~3.5x faster than zlib's, which measured a quarter of
    ``pitstop analyze``'s time on a gzipped trace; the stdlib's reader stands in where isal is not installed.
    """
    try:
        from isal import igzip, isal_zlib
    except ImportError:
        return gzip.GzipFile(fileobj=fileobj, mode="rb"), (EOFError, zlib.error, gzip.BadGzipFile)
    isal_error = cast(type[BaseException], isal_zlib.error)
    errors = (EOFError, zlib.error, gzip.BadGzipFile, isal_error)
    return igzip.IGzipFile(fileobj=fileobj, mode="rb"), errors


class _Text:
    """Decompressed bytes of a trace, read in pieces, checked to be UTF-8, with the ratio check."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = path.open("rb")
        except OSError as exc:
            raise IngestError(f"{path}: cannot open ({exc.strerror or exc})") from None
        self.counting: _Counting | None = None
        if raw.read(2) == GZIP_MAGIC:
            raw.seek(0)
            self.counting = _Counting(raw)
            self.stream, self.corrupt = _gzip_reader(self.counting)
        else:
            raw.seek(0)
            self.stream, self.corrupt = raw, ()
        self.raw = raw
        self.utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self.utf8_pending = False  # a multi-byte character is cut between two reads
        self.produced = 0
        self.eof = False

    def readinto(self, view: memoryview) -> int:
        """Inflate (or read) up to ``len(view)`` bytes of text straight into ``view``; 0 at the end."""
        if self.eof:
            return 0
        try:
            n: int = self.stream.readinto(view)
        except self.corrupt as exc:
            raise IngestError(f"{self.path}: truncated or corrupt gzip ({exc})") from None
        except OSError as exc:
            raise IngestError(f"{self.path}: cannot read ({exc})") from None
        self.produced += n
        if self.counting is not None and self.produced > RATIO_FLOOR:
            ratio = self.produced / max(self.counting.consumed, 1)
            if ratio > MAX_RATIO:
                raise IngestError(
                    f"{self.path}: gzip expands more than {MAX_RATIO}x ({self.produced >> 20} MiB from "
                    f"{self.counting.consumed >> 10} KiB), which no profiler trace does: refused as a "
                    "decompression bomb"
                )
        self.eof = not n
        return n

    def check_utf8(self, text: bytearray, new: int) -> None:
        """The last ``new`` bytes of ``text`` are UTF-8 (with what came before them); ``isascii`` over the
        whole buffer (its kept tail is small) spares most traces the decoder."""
        if self.utf8_pending or not text.isascii():
            try:
                self.utf8.decode(memoryview(text)[len(text) - new :], final=self.eof)
            except UnicodeDecodeError:
                raise IngestError(f"{self.path}: not UTF-8 text") from None
            self.utf8_pending = bool(self.utf8.getstate()[0])

    def close(self) -> None:
        self.stream.close()
        self.raw.close()


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Events are acyclic dicts freed batch by batch; the cycle collector would traverse each batch many
    times (measured: ~40% of the parse time) and can free nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _unviewed(buf: bytearray) -> bool:
    """True when no memoryview holds ``buf`` (it can be resized)."""
    try:
        buf.append(0)
    except BufferError:
        return False
    buf.pop()
    return True


def _trimmed(buf: bytearray, size: int) -> bytearray:
    """``buf`` cut to ``size`` bytes: in place, or as a copy where something still holds a view of it (C code
    that kept the buffer it was lent; a memoryview that could not be released)."""
    try:
        del buf[size:]
    except BufferError:
        return buf[:size]
    return buf


class _Reader:
    def __init__(self, text: _Text, fast: Fast | None = None) -> None:
        self.text = text
        self.fast = fast
        self.scan = scanner()
        self.path = text.path
        self.buf = bytearray()
        self.spare: bytearray | None = None  # the buffer read before self.buf (see more)
        self.i = 0
        self.base = 0  # offset in the text of buf[0]
        self.window = FIRST_WINDOW  # bytes to decode for the next value read on its own

    # -- buffer ---------------------------------------------------------------------------------------
    def more(self, n: int = READ_BYTES) -> bool:
        """Read at least some more text; False at the end of the input.

        The unread tail (and the byte before the cursor, which ``chunk`` writes over) is copied to the
        front of the spare buffer and the text is inflated straight after it. msgspec's Raw values are
        views into the buffer their batch was decoded from, so a buffer is never resized while viewed: the
        spare is the one read before the current one (its batch is freed by then), else a new one."""
        start = self.i - 1 if self.i > (len(self.buf) >> 1) else 0  # drop what was read, when it is most
        tail = len(self.buf) - start
        buf = self.spare if self.spare is not None and _unviewed(self.spare) else bytearray()
        if len(buf) < tail + n:
            buf.extend(bytes(tail + n - len(buf)))
        buf[:tail] = memoryview(self.buf)[start:]  # same length: copied in place
        while True:
            view = memoryview(buf)[tail : tail + n]
            try:
                got = self.text.readinto(view)
            finally:  # not left to the refcount: a frame that outlives the call (a sampling profiler's,
                with contextlib.suppress(BufferError):  # as Dask workers run) keeps its argument alive
                    view.release()
            if got:
                buf = _trimmed(buf, tail + got)
                self.text.check_utf8(buf, got)
                self.spare = self.buf
                self.buf, self.base, self.i = buf, self.base + start, self.i - start
                return True
            if self.text.eof:
                if self.text.utf8_pending:  # the text ends inside a multi-byte character
                    raise IngestError(f"{self.path}: not UTF-8 text")
                return False

    def ws(self) -> str:
        """Skip whitespace; the next byte as a character ('' at the end of the input)."""
        while True:
            self.i = _WS.match(self.buf, self.i).end()  # type: ignore[union-attr]
            if self.i < len(self.buf):
                return chr(self.buf[self.i])
            if not self.more():
                return ""

    def fail(self, what: str) -> IngestError:
        return IngestError(f"{self.path}: invalid JSON in the trace ({what})")

    def value(self) -> Any:
        """Exactly one JSON value at the cursor, reading more while it is incomplete (up to MAX_VALUE).

        The stdlib decoder reads ``str``: a window of the bytes from the cursor is decoded, twice the last
        value's size, widened while the value does not fit in it (so a file of values read one by one
        decodes each byte a few times, not once per value)."""
        self.ws()
        want = self.window
        while True:
            pending = len(self.buf) - self.i
            whole = want >= pending  # the window holds all the text read so far
            window = self.buf[self.i : self.i + want]
            text, _ = codecs.utf_8_decode(window, "strict", False)  # checked: only a cut tail is left out
            try:
                obj, end = _DECODER.raw_decode(text)
            except _NonFinite as exc:
                raise self.fail(f"{exc.args[0]} is not a JSON number") from None
            except _HugeInteger:
                raise self.fail(
                    f"an integer longer than {MAX_INT_DIGITS} digits, which no profiler writes"
                ) from None
            except RecursionError:
                raise IngestError(f"{self.path}: JSON nested too deeply to be a profiler trace") from None
            except json.JSONDecodeError as exc:
                if not whole:
                    want *= 4
                    continue
                if pending > MAX_VALUE:
                    raise IngestError(
                        f"{self.path}: one event or value is longer than {MAX_VALUE >> 20} MiB, which no "
                        "profiler trace writes"
                    ) from None
                if not self.more(max(READ_BYTES, pending)):
                    raise self.fail(f"{exc.msg}; the file may be truncated") from None
                continue
            if end == len(text) and (not whole or self.more(max(READ_BYTES, pending))):
                want *= 4  # it ends where the window does: a number may go on past it
                continue
            used = end if len(text) == len(window) else len(text[:end].encode())  # all ASCII: chars = bytes
            self.i += used
            self.window = max(FIRST_WINDOW, 2 * used)
            return obj

    def expect(self, chars: str) -> str:
        c = self.ws()
        if c == "" or c not in chars:
            got = (
                "the end of the file"
                if c == ""
                else repr(self.buf[self.i : self.i + 4].decode(errors="replace")[0])
            )
            raise self.fail(f"expected one of {' '.join(chars)} but found {got}")
        self.i += 1
        return c

    # -- document -------------------------------------------------------------------------------------
    def batches(self) -> Iterator[list[Any]]:
        self.more()
        if self.buf.startswith(BOM):
            self.i = len(BOM)
        if self.expect("{[") == "[":  # Trace Event Format's array form: the events alone
            yield from self.array()
            if self.ws() != "":
                raise self.fail("text after the array of events")
            return
        if self.ws() == "}":
            return
        while True:
            if self.ws() != '"':
                raise self.fail("expected a key")
            key = self.value()
            self.expect(":")
            if key == "traceEvents" and self.ws() == "[":
                self.i += 1
                yield from self.array()
            else:
                self.value()
            if self.expect(",}") == "}":
                return

    def chunk(self, cut: int) -> list[Any] | None:
        """The events from the cursor to the comma at ``cut``, decoded as one array, or None (read them value
        by value). The text is not copied: '[' is written over the byte before the cursor (read already) and
        ']' over the comma, which is put back after the decoding."""
        buf, i = self.buf, self.i
        assert i > 0  # the array's '[' or a consumed comma lies before the cursor; more() keeps a byte
        buf[i - 1] = 0x5B  # [
        buf[cut] = 0x5D  # ]
        chunk = memoryview(buf)[i - 1 : cut + 1]
        try:
            batch = self.fast(chunk) if self.fast is not None else None
            return batch if batch is not None else self.exact(chunk)
        finally:
            buf[cut] = 0x2C  # ,

    def exact(self, chunk: memoryview) -> list[Any] | None:
        """A chunk by the stdlib decoder; None where it is not a JSON array (read value by value)."""
        try:
            return _DECODER.decode(str(chunk, "utf-8"))  # UTF-8: checked as it was read
        except RecursionError:
            raise IngestError(f"{self.path}: JSON nested too deeply to be a profiler trace") from None
        except ValueError:
            return None

    def array(self) -> Iterator[list[Any]]:
        """The items of an array whose '[' was consumed, in batches cut at the last comma between two items
        in the text read so far (boundaries.py: one pass over the bytes, whatever the layout)."""
        if self.ws() == "]":
            self.i += 1
            return
        # offsets in the whole text (the buffer is compacted as it is consumed)
        scanned, depth, state, ended = self.base + self.i, 0, OUT_OF_STRING, False  # the scan's state there
        cut_at = -1  # the last boundary the scan found
        exact_until = -1  # after a chunk failed to parse, read value by value up to its cut
        while True:
            self.ws()
            here = self.base + self.i
            if here > scanned:  # values read one by one went past the scan: an item starts here
                scanned, depth, state, ended = here, 0, OUT_OF_STRING, False
            if not ended and scanned < self.base + len(self.buf):
                cut, stop, depth, state = self.scan(self.buf, scanned - self.base, depth, state, MAX_DEPTH)
                if depth > MAX_DEPTH:
                    raise IngestError(f"{self.path}: JSON nested too deeply to be a profiler trace")
                scanned, ended = self.base + stop, depth < 0
                cut_at = self.base + cut if cut >= 0 else cut_at
            if here > exact_until:
                if cut_at > here:
                    batch = self.chunk(cut_at - self.base)
                    if batch is None:
                        exact_until = cut_at
                    else:
                        yield batch
                        self.i = cut_at - self.base + 1
                        continue
                elif not ended and len(self.buf) - self.i < MAX_VALUE and self.more():
                    continue
            yield [self.value()]
            if self.expect(",]") == "]":
                return


def event_batches(path: Path, fast: Fast | None = None) -> Iterator[list[Any]]:
    """Lists of ``traceEvents`` items, in file order; an unreadable trace raises one IngestError.

    ``fast``, when given, is tried first on each chunk of whole events (``[...]`` text): a list it returns
    is yielded as the batch (its argument is ``[...]`` bytes), None sends the chunk to the exact path (the stdlib decoder, then value by
    value), so a batch is either all ``fast`` items or all plain JSON values."""
    text = _Text(path)
    try:
        with _no_cyclic_gc():
            yield from _Reader(text, fast).batches()
    finally:
        text.close()
