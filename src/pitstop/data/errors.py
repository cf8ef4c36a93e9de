"""The one error the data layer raises: a one-line message that names the file, the line or the cache."""

from __future__ import annotations

from pitstop.errors import PitstopError


class DataError(PitstopError):
    """Examples, a tokenizer or a cache cannot be used as asked."""


class BuildInterrupted(KeyboardInterrupt):
    """A cache build stopped by Ctrl-C or SIGTERM; says what was kept for the resume.

    A ``KeyboardInterrupt`` still (code that stops on Ctrl-C keeps stopping), with the facts a user needs:
    the folder holding the finished shards and how many examples they hold.
    """

    def __init__(self, partial: str, shards: int, examples: int, assembling: bool = False) -> None:
        super().__init__(partial)
        self.partial = partial
        self.shards = shards
        self.examples = examples
        self.assembling = assembling

    def kept(self) -> str:
        if self.shards == 0:
            return "no shard was finished yet; the same command starts again"
        done = "every shard" if self.assembling else f"{self.shards} finished shard{'s' * (self.shards != 1)}"
        return (
            f"{done} ({self.examples:,} examples) kept in {self.partial}; the same command resumes from there"
        )
