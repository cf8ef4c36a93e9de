"""How much of a dataset's compute would be padding: today's batching vs length grouping vs packing.

"Today" is padded the way the job pads: to each batch's longest example (``longest``, the default) or every
row to the row length (``max_length``, a tokenizer called with ``padding="max_length"``). ``job_padding``
reads that, the row length and the batch size from a ``pitstop doctor`` JSON of the job, which saw them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pitstop.data.packing import plan_packing
from pitstop.data.sampler import LengthGroupedBatchSampler, padding_share


@dataclass
class LengthStats:
    examples: int
    tokens: int
    min: int
    median: float
    p90: float
    max: int
    over_max_len: int
    batch_size: int
    max_len: int
    padding: str  # "longest" or "max_length"
    padding_basis: str  # why that padding was assumed: the default, the option given, or the run that saw it
    padding_now: float  # pad share with random batches of batch_size, padded as today
    padding_grouped: float  # with length-grouped batches (padded to the longest)
    padding_packed: float  # with best-fit-decreasing packing into max_len rows
    speedup_grouped: float
    speedup_packed: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class JobPadding:
    """How a measured run padded its batches, and what said so (for the report's one line)."""

    padding: str  # "longest" or "max_length"
    max_len: int | None  # the width every row was padded to (max_length); None when not fixed
    batch_size: int | None  # examples per micro-batch
    basis: str


def _int(value: Any) -> int | None:
    return (
        int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1 else None
    )


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def job_padding(doc: dict[str, Any]) -> JobPadding:
    """The padding a ``pitstop.run/1`` document measured: the job's tokenizer call with
    ``padding="max_length"`` (the length and the line), else padding_waste's evidence that every batch was one
    width, else the longest example of each batch (the batches' widths varied, or nothing said)."""
    env = _mapping(doc.get("environment"))
    loader = _mapping(env.get("dataloader"))
    batch = _int(env.get("micro_batch_size")) or _int(loader.get("batch_size"))
    pads_to = _int(loader.get("tokenizer_pads_to"))
    if pads_to is not None:
        site = loader.get("tokenizer_padding_site")
        where = f" at {site}" if isinstance(site, str) and site else ""
        return JobPadding(
            "max_length",
            pads_to,
            batch,
            f'padding="max_length" to {pads_to} tokens in the job\'s tokenizer call{where}',
        )
    listed = doc.get("findings")
    findings: list[Any] = listed if isinstance(listed, list) else []
    for finding in map(_mapping, findings):
        evidence = finding.get("evidence")
        if finding.get("cause") != "padding_waste" or not isinstance(evidence, dict):
            continue
        width = _int(evidence.get("padded_row_len"))
        if evidence.get("fixed_row_length") is True and width is not None:
            return JobPadding(
                "max_length", width, batch, f"every measured batch of the run was {width} tokens wide"
            )
        return JobPadding("longest", None, batch, "the run's batches varied in width: padded to the longest")
    return JobPadding("longest", None, batch, "the run saw no fixed width: padded to the longest (assumed)")


def length_stats(
    lengths: list[int],
    batch_size: int,
    max_len: int,
    padding: str = "longest",
    seed: int = 0,
    padding_basis: str | None = None,
) -> LengthStats:
    n = np.minimum(np.asarray(lengths, dtype=np.int64), max_len)
    if n.size == 0:
        raise ValueError("no examples")
    if padding not in ("longest", "max_length"):
        raise ValueError(f"padding is longest or max_length, not {padding!r}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n.size)
    random_batches = [order[i : i + batch_size].tolist() for i in range(0, n.size, batch_size)]
    pad_to = max_len if padding == "max_length" else None
    now = padding_share(n.tolist(), random_batches, pad_to)
    grouped = padding_share(
        n.tolist(), LengthGroupedBatchSampler(n.tolist(), batch_size, seed=seed).batches()
    )
    plan = plan_packing(n, max_len)
    packed = 1.0 - plan.efficiency
    raw = np.asarray(lengths, dtype=np.int64)
    return LengthStats(
        examples=int(n.size),
        tokens=int(n.sum()),
        min=int(raw.min()),
        median=float(np.median(raw)),
        p90=float(np.percentile(raw, 90)),
        max=int(raw.max()),
        over_max_len=int((raw > max_len).sum()),
        batch_size=batch_size,
        max_len=max_len,
        padding=padding,
        padding_basis=padding_basis or f"--padding {padding}",
        padding_now=now,
        padding_grouped=grouped,
        padding_packed=packed,
        # compute scales with the tokens processed: real tokens / (1 - pad share); attention gains more
        speedup_grouped=(1 - grouped) / (1 - now) if now < 1 else 1.0,
        speedup_packed=(1 - packed) / (1 - now) if now < 1 else 1.0,
    )
