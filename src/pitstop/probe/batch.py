"""Counting what a batch carries: rows, tokens, real (non-padding) tokens, loss tokens, examples.

Real tokens come from the attention mask when there is one; otherwise from the pad token id when the
model's config names one (distinct from its end-of-sequence token); otherwise from packed
``position_ids`` (flattened rows of examples that each restart at 0 carry no padding). A batch with none
of these (the usual pretraining loop: ``model(input_ids=x, labels=x)`` on full-length blocks) has every
token attended: all are real, except a padded tail the labels give away (one id repeated, labels ignored),
which is what the model would mask itself out of the loss.
Counting runs on the tensors as the DataLoader hands them over (on the host, as a rule); a batch that is
already on the GPU is counted there and read once at the end of the window, never with a sync per step.
A loop that builds its own batches (no DataLoader) is counted the same way from the inputs of the training
model's outermost forward (``count_model_inputs``). Labels below 0 are ignored: -100 (Hugging Face,
``CrossEntropyLoss``'s default) and -1 (nanoGPT's ``ignore_index``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pitstop.probe.timeline import BatchCounts


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "numel")


def _is_int_tensor(x: Any) -> bool:
    return _is_tensor(x) and not x.dtype.is_floating_point and not x.dtype.is_complex


def _count(x: Any) -> Any:
    """Sum of a boolean/0-1 tensor: an int on the host, a 0-dim tensor left on the device."""
    total = x.sum()
    return int(total) if total.device.type == "cpu" else total


def _fields(batch: Any) -> dict[str, Any]:
    if isinstance(batch, Mapping) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        try:
            return {str(k): batch[k] for k in batch.keys()}  # noqa: SIM118 - BatchEncoding is not a Mapping
        except Exception:
            return {}
    if isinstance(batch, list | tuple):
        ints = [x for x in batch if _is_int_tensor(x) and x.dim() == 2]
        found: dict[str, Any] = {}
        if ints:
            found["input_ids"] = ints[0]
            same = [x for x in ints[1:] if x.shape == ints[0].shape]
            if same:
                found["labels"] = same[0]
        return found
    if _is_int_tensor(batch) and batch.dim() == 2:
        return {"input_ids": batch}
    return {}


def _first_tensor(batch: Any) -> Any:
    if _is_tensor(batch):
        return batch
    values: Any = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    )
    return next((v for v in values if _is_tensor(v)), None)


def _nbytes(batch: Any) -> int:
    if _is_tensor(batch):
        return int(batch.numel() * batch.element_size())
    if isinstance(batch, Mapping) or hasattr(batch, "values"):
        try:
            return sum(_nbytes(v) for v in batch.values())
        except Exception:
            return 0
    if isinstance(batch, list | tuple):
        return sum(_nbytes(v) for v in batch)
    return 0


def packed_tail(ids: Any, positions: Any, labels: Any) -> tuple[int, int]:
    """(tokens, rows) of padding at the end of packed rows: the last run of positions from 0, when it is one
    token repeated and carries no label. Host tensors only (reading device ones would sync every step)."""
    if ids.dim() != 2 or ids.device.type != "cpu" or not _is_int_tensor(labels) or labels.shape != ids.shape:
        return 0, 0
    if positions.shape != ids.shape or ids.shape[1] < 2:
        return 0, 0
    tokens = rows = 0
    for b in range(ids.shape[0]):
        starts = (positions[b] == 0).nonzero()
        if starts.numel() < 2:
            continue  # one example in the row: nothing to tell it from padding
        last = int(starts[-1])
        seg_ids, seg_labels = ids[b, last:], labels[b, last:]
        if bool((seg_labels < 0).all()) and bool((seg_ids == seg_ids[0]).all()):
            tokens += ids.shape[1] - last
            rows += 1
    return tokens, rows


def unmasked_tail(ids: Any, labels: Any) -> int:
    """Tokens of padding at the end of rows that carry no mask: the trailing run where the labels are ignored
    and the ids are one token repeated. Host tensors only (reading device ones would sync every step)."""
    if ids.dim() != 2 or ids.device.type != "cpu" or not _is_int_tensor(labels) or labels.shape != ids.shape:
        return 0
    if not bool((labels[:, -1] < 0).any()):
        return 0  # a padded tail ends every row it is in with an ignored label; the common case, at once
    ignored = (labels < 0).flip(1).cumprod(1).sum(1)
    repeated = (ids == ids[:, -1:]).flip(1).cumprod(1).sum(1)
    return int(ignored.minimum(repeated).sum())


_INPUT_NAMES = ("input_ids", "inputs_embeds", "attention_mask", "labels", "position_ids")
_LABEL_NAMES = ("labels", "label", "targets", "target", "y")


def model_input_fields(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]
) -> dict[str, Any]:
    """The countable fields of one forward call: its keyword inputs by their Hugging Face names, positional
    inputs by the forward's parameter ``names`` where they are those, else the first 2-D integer tensor as the
    tokens and a second one of the same shape (not a mask) as the targets (``model(X, Y)``)."""
    found = {k: kwargs[k] for k in _INPUT_NAMES if _is_tensor(kwargs.get(k))}
    for k in _LABEL_NAMES[1:]:
        if "labels" not in found and _is_int_tensor(kwargs.get(k)):
            found["labels"] = kwargs[k]
    unnamed: list[Any] = []
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else ""
        if not _is_tensor(value):
            continue
        if name in _INPUT_NAMES:
            found.setdefault(name, value)
        elif name in _LABEL_NAMES:
            found.setdefault("labels", value)
        elif _is_int_tensor(value) and value.dim() == 2 and "mask" not in name and "type" not in name:
            unnamed.append(value)
    if unnamed and "input_ids" not in found and "inputs_embeds" not in found:
        found["input_ids"] = unnamed.pop(0)
    ids = found.get("input_ids")
    same = [x for x in unnamed if ids is not None and x.shape == ids.shape]
    if same and "labels" not in found:
        found["labels"] = same[0]
    return found


def count_model_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], pad_token_id: int | None = None
) -> BatchCounts:
    """Count one forward call's inputs as a micro-batch (``inputs_embeds``: rows × positions, real ones from
    the mask). Nothing is copied to the device or read from it here."""
    fields = model_input_fields(args, kwargs, names)
    embeds: Any = fields.get("inputs_embeds")
    if "input_ids" not in fields and _is_tensor(embeds) and embeds.dim() == 3:
        counts = BatchCounts(samples=int(embeds.shape[0]), tokens=int(embeds.shape[0] * embeds.shape[1]))
        counts.seq_len = int(embeds.shape[1])
        mask: Any = fields.get("attention_mask")
        labels: Any = fields.get("labels")
        if _is_tensor(mask) and tuple(mask.shape) == tuple(embeds.shape[:2]):
            counts.real_tokens = _count(mask != 0)
        else:
            counts.real_tokens = counts.tokens
        if _is_int_tensor(labels) and tuple(labels.shape) == tuple(embeds.shape[:2]):
            counts.loss_tokens = _count(labels >= 0)
        return counts
    if "input_ids" not in fields:
        first = next((v for v in (*args, *kwargs.values()) if _is_tensor(v) and v.dim() >= 1), None)
        return BatchCounts(samples=int(first.shape[0]) if first is not None else None)
    return count_batch(fields, pad_token_id, nbytes=0)


def count_batch(batch: Any, pad_token_id: int | None = None, nbytes: int | None = None) -> BatchCounts:
    """Count one micro-batch. Unknown quantities stay None."""
    fields = _fields(batch)
    counts = BatchCounts(nbytes=_nbytes(batch) if nbytes is None else nbytes)
    ids = fields.get("input_ids")
    if ids is None or not _is_int_tensor(ids):
        first = _first_tensor(batch)
        if first is not None and first.dim() >= 1:
            counts.samples = int(first.shape[0])
        return counts

    rows = int(ids.shape[0]) if ids.dim() >= 2 else 1
    counts.samples = rows
    counts.tokens = int(ids.numel())
    counts.seq_len = int(ids.shape[-1])

    mask: Any = fields.get("attention_mask")
    positions: Any = fields.get("position_ids")
    labels: Any = fields.get("labels")
    real = _real(ids, mask, pad_token_id)  # read once: real tokens, attended and packed rows all need it
    if real is not None:
        counts.real_tokens = _count(real)
    elif _is_int_tensor(positions) and positions.shape[-1] == ids.shape[-1]:
        # flattened / packed rows without a pad token: only a padded tail can be padding
        tail = packed_tail(ids, positions, labels)
        counts.real_tokens = counts.tokens - tail[0]
    else:  # no mask: every token is attended; only a padded tail the labels ignore is not real
        counts.real_tokens = counts.tokens - unmasked_tail(ids, labels)
    if _is_int_tensor(positions) and positions.shape == ids.shape:
        starts = positions == 0  # each example restarts its positions at 0 (a padded tail may too)
        counts.examples = _count(starts if pad_token_id is None else starts & (ids != pad_token_id))
        if pad_token_id is None and counts.real_tokens is not None and isinstance(counts.examples, int):
            counts.examples -= packed_tail(ids, positions, labels)[1]
    elif counts.real_tokens is not None:
        counts.examples = rows
    if _is_int_tensor(labels) and labels.shape == ids.shape:
        counts.loss_tokens = _count(labels >= 0)
    counts.attended = _attended(ids, real, positions)
    if not _is_tensor(positions) and ids.dim() == 2 and real is not None:  # one example per row
        counts.packed_rows = _packed_rows(real.sum(-1), int(ids.shape[-1]))
    return counts


def _real(ids: Any, mask: Any, pad_token_id: int | None) -> Any:
    """Which tokens are real, from the attention mask, else the pad token id; None when neither says."""
    if _is_tensor(mask) and mask.dim() == 2 and mask.shape == ids.shape:
        return mask != 0
    if pad_token_id is not None:
        return ids != pad_token_id
    return None


@dataclass(frozen=True)
class RowLengths:
    """A batch's real tokens per row, still on the device: packed into rows of ``width`` at the window's end
    (a device sync then, never inside a step)."""

    lengths: Any
    width: int

    def resolve(self) -> int:
        return rows_first_fit([int(n) for n in self.lengths.tolist()], self.width)


def rows_first_fit(lengths: list[int], width: int) -> int:
    """Rows a right-padded batch's examples fill when each goes into the first row it fits, in order, rows of
    ``width`` tokens: what the ``pack_batch`` fix builds where attention takes a dense mask."""
    from pitstop.trials.collate import first_fit

    examples = [i for i, n in enumerate(lengths) if n]
    return len(first_fit(examples, lengths, width)) if examples else 0


def _packed_rows(lengths: Any, width: int) -> Any:
    """Rows the batch's examples (their real tokens per row) need packed at its width: counted now on the
    host, left for the window's end on a device."""
    if lengths.device.type == "cpu":
        return rows_first_fit([int(n) for n in lengths.tolist()], width)
    return RowLengths(lengths, width)


def _attended(ids: Any, real: Any, positions: Any) -> Any:
    """Σ L² over the batch's examples, without a device sync: a token at position p of an example adds
    2p + 1 (Σ_{p<L} (2p + 1) = L²); a padded row of n real tokens adds n². The attention term of the FLOPs
    model weights context by it (E[L²] / E[L], ``plan.flops``)."""
    if _is_int_tensor(positions) and positions.shape == ids.shape:
        weights = 2 * positions + 1
        return _count(weights if real is None else weights * real)
    if ids.dim() != 2:
        return None
    if real is None:
        return int(ids.shape[0]) * int(ids.shape[1]) ** 2  # every row is one full-length example
    n = real.sum(-1)
    return _count(n * n)
