"""The trace reader's event loop in C (see _eventloop.c and events.py's _EventLoop)."""

from array import array
from collections.abc import Callable
from typing import Any

class Loop:
    def __init__(
        self,
        *,
        event_type: type,
        args_type: type,
        bad_event: object,
        no_args: object,
        missing: object,
        memos: tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any], dict[Any, Any]],
        calls: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[[Any], int]],
        categories: dict[str, int],
        gemm_kinds: tuple[str, ...],
        columns: tuple[array, ...],
        roles: tuple[int, ...],
        one: Callable[[bytes], Any] | None = None,
    ) -> None: ...
    def take(self, batch: list[Any]) -> int: ...
    def take_text(self, text: bytes | bytearray | memoryview, /) -> tuple[int, int] | None: ...
    def state(self) -> tuple[float, float, str | None, int, int, tuple[float, float, float, float]]: ...

def scan(
    text: bytes | bytearray | memoryview, start: int, depth: int, state: int, max_depth: int, /
) -> tuple[int, int, int, int]: ...
