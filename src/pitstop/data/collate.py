"""From packed rows to a model's forward arguments, with every example kept apart.

A packed row is ``{"input_ids", "labels", "seq_lens"}`` (the lengths of the examples in it, in order). For
every backend the collator restarts ``position_ids`` at each example (rotary and learned positions see each
example from 0) and ignores the first label of each example (so the previous example's last token never
predicts across the boundary). What keeps attention inside an example depends on the backend:

* ``flash_attention_2`` / ``flash_attention_3``: the batch is flattened into one row; ``position_ids`` plus
  ``cu_seq_lens_q/k`` and ``max_length_q/k`` drive the variable-length kernel; no mask. The kernel wants
  the two maxima as Python ints (a tensor would cost a device sync to read), yet a plain loop moves a batch
  with ``{k: v.to(device) for k, v in batch.items()}``: they are ``Length``, an ``int`` that also answers
  ``.to()``, ``.cuda()`` and ``.pin_memory()`` with itself, so the batch goes through any loop unchanged.
* ``sdpa``: a 4-D boolean block-diagonal causal mask (True = may attend). With transformers 5, SDPA given
  only reset ``position_ids`` can mix examples, so the mask is explicit.
* ``eager``: the same blocks as an additive float mask (0 or the dtype's minimum); eager attention *adds* the
  mask to the scores, so a boolean mask would be silently wrong there.
* ``flex_attention``: a ``BlockMask`` built from per-token document ids.

Padding at the end of shorter rows attends only to itself (a fully masked query row would give NaN) and
carries label -100. Loss: Hugging Face causal-LM heads average the loss over all labelled tokens of the
batch; packing keeps exactly the labelled tokens of the unpacked examples, so the packed loss equals the
unpacked token mean over the same examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IGNORE_INDEX = -100
FLASH = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/flash-attn3",
)


class Length(int):
    """An ``int`` that moves like a tensor: ``.to(...)``, ``.cuda()``, ``.pin_memory()`` return it as is."""

    def to(self, *args: Any, **kwargs: Any) -> Length:
        return self

    def cuda(self, *args: Any, **kwargs: Any) -> Length:
        return self

    def pin_memory(self, *args: Any, **kwargs: Any) -> Length:
        return self

    def __reduce__(self) -> tuple[type[Length], tuple[int]]:  # DataLoader workers pickle batches
        return (Length, (int(self),))


def _as_array(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "numpy") and hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64)


class PackingCollator:
    """Collate packed rows for ``attn_implementation`` (the model's ``config._attn_implementation``)."""

    def __init__(self, attn_implementation: str = "sdpa", pad_token_id: int = 0, dtype: Any = None) -> None:
        self.attn = attn_implementation or "sdpa"
        if self.attn not in (*FLASH, "sdpa", "eager", "flex_attention"):
            raise ValueError(
                f"no packing support for attn_implementation={self.attn!r}; "
                "use sdpa, eager, flex_attention or flash_attention_2/3"
            )
        self.pad_token_id = pad_token_id
        self.dtype = dtype  # the model's dtype, for the eager float mask (default: float32)

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import numpy as np
        import torch

        ids = [_as_array(r["input_ids"]) for r in rows]
        labels = [_as_array(r.get("labels", r["input_ids"])).copy() for r in rows]
        lens = [[int(n) for n in r.get("seq_lens", [len(i)])] for r, i in zip(rows, ids, strict=True)]
        for i, (row_ids, row_lens) in enumerate(zip(ids, lens, strict=True)):
            if sum(row_lens) != len(row_ids):
                raise ValueError(
                    f"row {i}: seq_lens add up to {sum(row_lens)}, the row has {len(row_ids)} tokens"
                )
        for row_labels, row_lens in zip(labels, lens, strict=True):
            starts = np.cumsum([0, *row_lens[:-1]])
            row_labels[starts[np.asarray(row_lens) > 0]] = IGNORE_INDEX  # no prediction across a boundary
        if self.attn in FLASH:
            return self._flattened(ids, labels, lens)
        width = max(len(r) for r in ids)
        batch_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        batch_labels = np.full((len(rows), width), IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        for b, (row_ids, row_labels, row_lens) in enumerate(zip(ids, labels, lens, strict=True)):
            n = len(row_ids)
            batch_ids[b, :n] = row_ids
            batch_labels[b, :n] = row_labels
            positions[b, :n] = _restarting_positions(row_lens)
            positions[b, n:] = np.arange(width - n)
        out = {
            "input_ids": torch.from_numpy(batch_ids),
            "labels": torch.from_numpy(batch_labels),
            "position_ids": torch.from_numpy(positions),
        }
        if self.attn == "flex_attention":
            doc = np.full((len(rows), width), -1, dtype=np.int64)
            for b, row_lens in enumerate(lens):
                doc[b, : sum(row_lens)] = np.repeat(np.arange(len(row_lens)), row_lens)
            out["attention_mask"] = self._block_mask(torch.from_numpy(doc))
        else:
            allowed = self._allowed(lens, width)
            if self.attn == "eager":
                dtype = self.dtype or torch.float32
                mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype)
                mask.masked_fill_(allowed, 0.0)
                out["attention_mask"] = mask
            else:
                out["attention_mask"] = allowed
        return out

    @staticmethod
    def _allowed(lens: list[list[int]], width: int) -> Any:
        """(B, 1, S, S) boolean: same example and not in the future; padding sees only itself.

        Only the diagonal blocks are written (Σ n² cells per row, not S²), from one cached triangle."""
        import torch

        allowed = torch.zeros((len(lens), 1, width, width), dtype=torch.bool)
        longest = max((n for row in lens for n in row), default=0)
        tri = torch.ones(longest, longest, dtype=torch.bool).tril()
        for b, row_lens in enumerate(lens):
            start = 0
            for n in row_lens:
                allowed[b, 0, start : start + n, start : start + n] = tri[:n, :n]
                start += n
            pad = torch.arange(start, width)
            allowed[b, 0, pad, pad] = True
        return allowed

    @staticmethod
    def _block_mask(doc: Any) -> Any:
        from torch.nn.attention.flex_attention import create_block_mask

        batch, width = doc.shape

        def same_example(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return ((doc[b, q] == doc[b, kv]) & (q >= kv)) | (q == kv)

        return create_block_mask(
            same_example, B=batch, H=None, Q_LEN=width, KV_LEN=width, device=str(doc.device)
        )

    def _flattened(self, ids: list[Any], labels: list[Any], lens: list[list[int]]) -> dict[str, Any]:
        import numpy as np
        import torch

        seq_lens = [n for row in lens for n in row if n]
        cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(seq_lens, dtype=torch.int32), 0)
        longest = max(seq_lens) if seq_lens else 0
        return {
            "input_ids": torch.from_numpy(np.concatenate(ids)[None]),
            "labels": torch.from_numpy(np.concatenate(labels)[None]),
            "position_ids": torch.from_numpy(_restarting_positions(seq_lens)[None]),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": Length(longest),
            "max_length_k": Length(longest),
        }


def _restarting_positions(lengths: list[int]) -> Any:
    """0..n-1 for each example, concatenated, without a Python loop over tokens."""
    import numpy as np

    total = int(sum(lengths))
    starts = np.repeat(np.cumsum([0, *lengths[:-1]]), lengths) if lengths else np.zeros(0, dtype=np.int64)
    return np.arange(total, dtype=np.int64) - starts
