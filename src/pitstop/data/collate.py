"""From packed rows to a model's forward arguments, with every example kept apart.

A packed row is ``{"input_ids", "labels", "seq_lens"}`` (the lengths of the examples in it, in order). For
every backend the collator restarts ``position_ids`` at each example (rotary and learned positions see each
example from 0) and ignores the first label of each example (so the previous example's last token never
predicts across the boundary). What keeps attention inside an example depends on the backend:

* ``flash_attention_2`` / ``flash_attention_3``: the batch is flattened into one row; ``position_ids`` plus
  ``cu_seq_lens_q/k`` and ``max_length_q/k`` drive the variable-length kernel; no mask.
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


def _as_list(value: Any) -> list[int]:
    if hasattr(value, "tolist"):
        return [int(v) for v in value.tolist()]
    return [int(v) for v in value]


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
        import torch

        ids = [_as_list(r["input_ids"]) for r in rows]
        labels = [_as_list(r.get("labels", r["input_ids"])) for r in rows]
        lens = [[int(n) for n in r.get("seq_lens", [len(i)])] for r, i in zip(rows, ids, strict=True)]
        for i, (row_ids, row_lens) in enumerate(zip(ids, lens, strict=True)):
            if sum(row_lens) != len(row_ids):
                raise ValueError(
                    f"row {i}: seq_lens add up to {sum(row_lens)}, the row has {len(row_ids)} tokens"
                )
        for row_labels, row_lens in zip(labels, lens, strict=True):
            start = 0
            for n in row_lens:
                if n:
                    row_labels[start] = IGNORE_INDEX  # no prediction across an example boundary
                start += n
        if self.attn in FLASH:
            return self._flattened(ids, labels, lens)
        width = max(len(r) for r in ids)
        batch_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        batch_labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        doc = torch.full((len(rows), width), -1, dtype=torch.long)  # example number per token; -1 = padding
        for b, (row_ids, row_labels, row_lens) in enumerate(zip(ids, labels, lens, strict=True)):
            n = len(row_ids)
            batch_ids[b, :n] = torch.tensor(row_ids, dtype=torch.long)
            batch_labels[b, :n] = torch.tensor(row_labels, dtype=torch.long)
            start = 0
            for k, length in enumerate(row_lens):
                positions[b, start : start + length] = torch.arange(length)
                doc[b, start : start + length] = k
                start += length
            positions[b, n:] = torch.arange(width - n)
        out = {"input_ids": batch_ids, "labels": batch_labels, "position_ids": positions}
        if self.attn == "flex_attention":
            out["attention_mask"] = self._block_mask(doc)
        else:
            allowed = self._allowed(doc)
            if self.attn == "eager":
                dtype = self.dtype or torch.float32
                mask = torch.zeros(allowed.shape, dtype=dtype)
                mask.masked_fill_(~allowed, torch.finfo(dtype).min)
                out["attention_mask"] = mask
            else:
                out["attention_mask"] = allowed
        return out

    @staticmethod
    def _allowed(doc: Any) -> Any:
        """(B, 1, S, S) boolean: same example and not in the future; padding sees only itself."""
        import torch

        width = doc.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        same = doc[:, :, None] == doc[:, None, :]
        real = (doc >= 0)[:, :, None]
        allowed = same & causal & real
        eye = torch.eye(width, dtype=torch.bool).expand_as(allowed)
        return (allowed | (eye & ~real)).unsqueeze(1)

    @staticmethod
    def _block_mask(doc: Any) -> Any:
        from torch.nn.attention.flex_attention import create_block_mask

        batch, width = doc.shape

        def same_example(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return ((doc[b, q] == doc[b, kv]) & (q >= kv)) | (q == kv)

        return create_block_mask(
            same_example, B=batch, H=None, Q_LEN=width, KV_LEN=width, device=str(doc.device)
        )

    def _flattened(
        self, ids: list[list[int]], labels: list[list[int]], lens: list[list[int]]
    ) -> dict[str, Any]:
        import torch

        flat_ids = [t for row in ids for t in row]
        flat_labels = [t for row in labels for t in row]
        seq_lens = [n for row in lens for n in row if n]
        positions = [p for n in seq_lens for p in range(n)]
        cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(seq_lens, dtype=torch.int32), 0)
        longest = max(seq_lens) if seq_lens else 0
        return {
            "input_ids": torch.tensor([flat_ids], dtype=torch.long),
            "labels": torch.tensor([flat_labels], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": longest,
            "max_length_k": longest,
        }
