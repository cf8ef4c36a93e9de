"""SIGTERM and SIGHUP raised as KeyboardInterrupt around a block, so its ``finally`` runs.

Their default ends pitstop on the spot: the command's process group would outlive it (``runner``), an
attached job would keep pitstop's probe armed until its watchdog (``attach``). Inside the block they raise
what ``make`` builds from the signal number instead, as Ctrl-C does. Handlers can be set on the main thread
only; elsewhere the block runs with the handlers as they are. The old handlers come back after.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminate_as_interrupt(make: Callable[[int], KeyboardInterrupt], *, once: bool = False) -> Iterator[None]:
    """``once``: only the first signal raises; later ones are ignored (a clean-up that must not be cut)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if once and fired:
            return
        fired.append(signum)
        raise make(signum)

    previous = {sig: signal.signal(sig, handler) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
