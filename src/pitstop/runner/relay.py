"""The job's output, relayed through pitstop: shown on pitstop's terminal until pitstop stops the job, and
kept whole in a log file.

Once a window is written, pitstop stops the job as Ctrl-C does; the job's reaction (a ``KeyboardInterrupt``
traceback of forty lines) read as a crash when it reached the terminal. So the job does not write to
pitstop's stdout and stderr directly: it writes to a pipe, or to a pseudo-terminal where pitstop's own stream
is a terminal (so ``isatty()``, tqdm's bars and the terminal's width are what the job sees without pitstop),
and a small relay process copies every byte to the log file and, until pitstop says ``stop``, to pitstop's
stream. pitstop waits for the relay's answer before it sends SIGINT, so nothing the job writes after the stop
reaches the terminal.

The relay is a process of its own (no site, its own session), not a thread of pitstop: should pitstop die,
it goes on copying the job's last words (the parent-death SIGINT's traceback) into the log until the job's
end closes the pipes, so the log is complete whatever happens to pitstop.

It also tells pitstop whether the last byte it showed on pitstop's stderr ended a line (a file of one byte in
the run folder, :func:`at_line_start`): a tqdm bar redrawn with ``\\r`` leaves the line open, and pitstop's
own progress lines then start with a newline instead of being glued onto the bar.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.probe.ending import LINE_STATE

STOP_ANSWER_S = 5.0  # the longest pitstop waits for the relay to confirm the stop
DRAIN_S = 5.0  # the longest pitstop waits, once the job ended, for the relay to copy what is left

# The relay: argv is the log's fd, the line state's fd, the fd whose line state is published (pitstop's
# stderr, -1 for none), then SOURCE:DEST pairs (DEST -1: the log only). stdin carries pitstop's "stop";
# stdout its answer, "ok N" with N the bytes logged before the stop. A control message is always handled
# before the next read of the job's output, so once pitstop has the answer no later byte is shown.
_RELAY = r"""
import os, select, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
log, state, watched = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
routes = {}
for pair in sys.argv[4:]:
    src, _, dst = pair.partition(":")
    routes[int(src)] = int(dst)
showing = {dst for dst in routes.values() if dst >= 0}
ended = {dst: True for dst in showing}
logged = 0
listening = True
def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
def publish(dst):
    if dst == watched:
        try:
            os.pwrite(state, b"1" if ended[dst] else b"0", 0)
        except OSError:
            pass
def close_lines():
    for dst in list(showing):
        if not ended[dst]:
            try:
                write_all(dst, b"\n")
            except OSError:
                pass
            ended[dst] = True
            publish(dst)
    showing.clear()
while routes:
    ready = select.select(list(routes) + ([0] if listening else []), [], [])[0]
    if 0 in ready:
        said = os.read(0, 64)
        if not said:
            listening = False  # pitstop is gone: the rest goes to the log alone
            showing.clear()
        elif b"stop" in said:
            close_lines()
            os.write(1, b"ok %d\n" % logged)
        continue
    for src in ready:
        try:
            data = os.read(src, 65536)
        except OSError:  # EIO: a pseudo-terminal whose every writer is gone
            data = b""
        if not data:
            os.close(src)
            del routes[src]
            continue
        try:
            write_all(log, data)
            logged += len(data)
        except OSError:
            pass
        dst = routes[src]
        if dst in showing:
            try:
                write_all(dst, data)
            except OSError:  # the terminal went away, a closed pipe: the log still has it
                showing.discard(dst)
                continue
            ended[dst] = data.endswith(b"\n")
            publish(dst)  # each time: pitstop marks the line ended after its own lines
close_lines()
"""


def ends_line(previous: bool, data: bytes) -> bool:
    """Whether the stream is at the start of a line after ``data`` was written (what the relay tracks)."""
    return data.endswith(b"\n") if data else previous


def at_line_start(run_folder: Path) -> bool:
    """Whether the last byte of the job's output shown on pitstop's stderr ended a line (True when no relay
    shows the job's output there)."""
    with contextlib.suppress(OSError), open(run_folder / LINE_STATE, "rb") as f:
        return f.read(1) != b"0"
    return True


def mark_line_start(run_folder: Path) -> None:
    """pitstop ended the line itself (its own progress line): the next one needs no newline first."""
    path = run_folder / LINE_STATE
    if path.exists():
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, b"1", 0)
            finally:
                os.close(fd)


@dataclass
class _Stream:
    """One way out of the job: the fd the job writes to, the one the relay reads, where it is shown."""

    job_end: int
    relay_end: int
    shown_on: int


def _terminal_copy(shown_on: int) -> tuple[int, int]:
    """A pseudo-terminal as wide and tall as pitstop's terminal, passing bytes unchanged (no ``\\n`` to
    ``\\r\\n``: the real terminal does that to what the relay writes). Returns (the job's end, the relay's)."""
    relay_end, job_end = os.openpty()
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(shown_on, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(job_end, termios.TIOCSWINSZ, size)
    with contextlib.suppress(termios.error):
        attrs = termios.tcgetattr(job_end)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(job_end, termios.TCSANOW, attrs)
    return job_end, relay_end


def _stream_to(shown_on: int) -> _Stream:
    if os.isatty(shown_on):
        job_end, relay_end = _terminal_copy(shown_on)
    else:
        relay_end, job_end = os.pipe()
    return _Stream(job_end, relay_end, shown_on)


def _same(a: int, b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(a), os.fstat(b))
    except OSError:
        return False


@dataclass
class Relay:
    """The relay process and the fds the job gets as its stdout and stderr (:meth:`start`)."""

    proc: subprocess.Popen[bytes]
    stdout: int  # the job's fd 1 and 2, closed in pitstop once the job has them (:meth:`job_started`)
    stderr: int
    log_path: Path
    shown: int | None = None  # bytes of the log shown before pitstop stopped the job (None: not stopped)
    _job_ends: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, log_path: Path, run_folder: Path) -> Relay | None:
        """A relay from the job to pitstop's own stdout and stderr (None where pitstop has no usable stdout
        or stderr: the job then inherits them, as without a relay)."""
        try:
            os.fstat(1)
            os.fstat(2)
        except OSError:
            return None
        streams: list[_Stream] = []
        opened: list[int] = []
        try:
            if _same(1, 2):  # one terminal or one pipe (2>&1): one stream keeps the job's order of lines
                streams.append(_stream_to(2))
                out = err = streams[0]
            else:
                streams.append(out := _stream_to(1))
                streams.append(err := _stream_to(2))
            state_path = run_folder / LINE_STATE
            state_path.write_bytes(b"1")
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            opened.append(log)
            state = os.open(state_path, os.O_RDWR)
            opened.append(state)
            shown_ends = [os.dup(s.shown_on) for s in streams]  # the relay's copies of pitstop's 1 and 2
            opened += shown_ends
            routes = [f"{s.relay_end}:{d}" for s, d in zip(streams, shown_ends, strict=True)]
            watched = shown_ends[streams.index(err)]
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _RELAY, str(log), str(state), str(watched), *routes],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=[log, state, *shown_ends, *(s.relay_end for s in streams)],
                start_new_session=True,  # a Ctrl-C at the terminal or pitstop's death does not end it
            )
        except OSError:
            for s in streams:
                _close(s.job_end, s.relay_end)
            return None
        finally:
            _close(*opened)
        _close(*(s.relay_end for s in streams))
        return cls(proc, out.job_end, err.job_end, log_path, _job_ends=[s.job_end for s in streams])

    def job_started(self) -> None:
        """The job holds its ends now: pitstop lets go of its copies, so the job's end is the relay's EOF."""
        _close(*self._job_ends)
        self._job_ends = []

    def stop_showing(self) -> int | None:
        """Nothing more reaches the terminal: returns once the relay confirms, with the bytes shown until
        then (None if it did not answer: its output may then be shown a little past the stop)."""
        if self.shown is not None:
            return self.shown
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None:
            return None
        try:
            stdin.write(b"stop\n")
            stdin.flush()
            if not select.select([stdout], [], [], STOP_ANSWER_S)[0]:
                return None
            answer = stdout.readline().split()
        except (OSError, ValueError):
            return None
        if len(answer) == 2 and answer[0] == b"ok" and answer[1].isdigit():
            self.shown = int(answer[1])
        return self.shown

    def finish(self) -> None:
        """The job is over: let the relay copy what is left (it ends at the pipes' EOF), then let it go."""
        self.job_started()  # the job never started: its ends are closed here
        try:
            self.proc.wait(timeout=DRAIN_S)
        except subprocess.TimeoutExpired:  # a process of the job pitstop could not end still holds a pipe
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def lines_before(log_path: Path, offset: int) -> int:
    """How many lines of the log end before ``offset`` (the job's output after a stop starts on the next)."""
    count = 0
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        left = offset
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count
