"""The few fields of a Kineto event that the analyses read, decoded by msgspec straight from a chunk of
trace text.

Why: the stdlib decoder builds a dict with every key and value of every event (operator input shapes, call
stacks, flow ids), and that was ~70% of ``pitstop analyze``. msgspec decodes into fixed structs and only
validates what it skips, ~4x faster on Kineto text. Every field is ``Any`` (or a ``Raw`` span) so a value
of an unexpected type comes out as the stdlib would give it and meets the same checks in the event loop;
the one typed field, ``args``, makes a chunk whose args is not an object fail here and go to the stdlib
path. msgspec and the stdlib agree on every valid JSON value (big ints stay ints, floats round the same,
duplicate keys: the last wins) and msgspec rejects all the stdlib rejects (NaN, control characters, lone
surrogates, deep nesting), so a chunk either decodes to the same facts or falls back to the exact path.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, cast

import msgspec
from msgspec import Raw, Struct, field


class _Missing:
    """A key that is absent (where absent and ``null`` differ)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_NO_RAW = Raw(b"")


class Args(Struct, gc=False):
    """The ``args`` keys read anywhere in events.py, with the defaults ``dict.get`` gave there."""

    stream: Any = MISSING  # presence matters: any event with a stream is kept
    device: Any = None
    correlation: Any = None
    external: Any = field(default=MISSING, name="External id")
    external_lower: Any = field(default=None, name="external id")
    nbytes: Any = field(default=None, name="bytes")
    # a Raw span, decoded for matmuls only (the stdlib path stores the decoded value, None when absent)
    input_type: Raw = field(default=_NO_RAW, name="Input type")
    input_dims: Raw = field(default=_NO_RAW, name="Input Dims")  # the same, for the shapes (trace/shapes.py)
    collective: Any = field(default=None, name="Collective name")
    in_nelems: Any = field(default=None, name="In msg nelems")
    out_nelems: Any = field(default=None, name="Out msg nelems")
    dtype: Any = ""
    group: Any = field(default="", name="Process Group Name")
    group_size: Any = field(default=None, name="Group size")

    def external_id(self) -> Any:
        """``args.get("External id", args.get("external id"))``."""
        return self.external if self.external is not MISSING else self.external_lower

    def input_types(self) -> Any:
        """The "Input type" value, or None when absent."""
        value = self.input_type
        if type(value) is Raw:
            return msgspec.json.decode(value) if value else None
        return value

    def input_shapes(self) -> Any:
        """The "Input Dims" value, or None when absent."""
        value = self.input_dims
        if type(value) is Raw:
            return msgspec.json.decode(value) if value else None
        return value


# every phase of the Trace Event Format; an event of another phase, or without one, sends its chunk to
# the untagged decoder below
PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c")


class Event(Struct, gc=False, tag="X", tag_field="ph", kw_only=True):
    """A complete event (``"ph": "X"``), the only phase the analyses read.

    ``ts`` and ``dur`` are numbers here, on every path (the event loop then checks only their range): a
    quoted number, a boolean or a missing ``ts`` sends msgspec's chunk to the untagged decoder, and
    ``_complete`` converts the value as ``float()`` does, or makes the event ``BAD``."""

    cat: Any = ""
    name: Any = ""
    ts: int | float
    dur: int | float = 0.0
    args: Args | None = None


class _Bad(Struct, gc=False):
    """A complete event whose time is not a number: the loop counts it as malformed."""


BAD = _Bad()


def _skipped(phase: str) -> type[Struct]:
    """An event of another phase, decoded to nothing but its tag: a third of a Kineto trace is flow
    events ("s" / "f"), and building their fields cost ~15% of the decoding."""
    return cast(type[Struct], type(f"Phase_{phase}", (Struct,), {}, gc=False, tag=phase, tag_field="ph"))


class _AnyPhase(Struct, gc=False):
    """An event of any phase (or none), for the chunks the tagged decoder declines."""

    ph: Any = None
    cat: Any = ""
    name: Any = ""
    ts: Any = MISSING
    dur: Any = 0.0
    args: Args | None = None


_EVENT_OR_SKIPPED: Any = functools.reduce(
    operator.or_, (_skipped(p) for p in PHASES), Event
)  # Event | Phase_B | ...
_TAGGED = msgspec.json.Decoder(list[_EVENT_OR_SKIPPED])
# one event's text, as an item of _TAGGED's list decodes: the C loop's reader of text (take_text) hands it
# the events its own values do not settle
decode_one = msgspec.json.Decoder(_EVENT_OR_SKIPPED).decode
_UNTAGGED = msgspec.json.Decoder(list[_AnyPhase])
NO_ARGS = Args()
_OTHER = _AnyPhase()  # what an event that is not complete becomes: the event loop skips it


def decode(text: bytes | memoryview | str) -> list[Any] | None:
    """The events of one JSON array text (``Event`` for complete events, other objects for the rest), or
    None where msgspec cannot take it (the caller falls back)."""
    try:
        return _TAGGED.decode(text)
    except Exception:  # DecodeError, ValidationError, RecursionError, UnicodeEncodeError: try untagged
        pass
    try:
        events = _UNTAGGED.decode(text)
    except Exception:
        return None
    return [_complete(e.cat, e.name, e.ts, e.dur, e.args) if e.ph == "X" else _OTHER for e in events]


def _complete(cat: Any, name: Any, ts: Any, dur: Any, args: Args | None) -> Event | _Bad:
    """An Event from untyped fields: a time that is not an int or float is converted by ``float()`` (a
    quoted number, a boolean), and an event without a numeric time is BAD."""
    try:
        if type(ts) is not float and type(ts) is not int:
            ts = float(ts)  # MISSING, None, a list: TypeError
        if type(dur) is not float and type(dur) is not int:
            dur = float(dur)
    except (TypeError, ValueError):
        return BAD
    return Event(cat=cat, name=name, ts=ts, dur=dur, args=args)


def _as_args(value: dict[str, Any]) -> Args:
    return Args(
        stream=value.get("stream", MISSING),
        device=value.get("device"),
        correlation=value.get("correlation"),
        external=value.get("External id", MISSING),
        external_lower=value.get("external id"),
        nbytes=value.get("bytes"),
        input_type=cast(Raw, value.get("Input type")),  # the decoded value (input_types() takes both)
        input_dims=cast(Raw, value.get("Input Dims")),
        collective=value.get("Collective name"),
        in_nelems=value.get("In msg nelems"),
        out_nelems=value.get("Out msg nelems"),
        dtype=value.get("dtype", ""),
        group=value.get("Process Group Name", ""),
        group_size=value.get("Group size"),
    )


def as_event(value: Any) -> Event | _Bad | None:
    """A stdlib-decoded item as the Event msgspec would give (BAD for a time that is not a number), None
    if it is not a complete event."""
    if type(value) is not dict or value.get("ph") != "X":
        return None
    args = value.get("args")
    return _complete(
        value.get("cat", ""),
        value.get("name", ""),
        value.get("ts", MISSING),
        value.get("dur", 0.0),
        _as_args(args) if type(args) is dict else None,
    )
