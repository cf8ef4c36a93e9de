"""Tokenizers and templates: an example's turns become token ids plus a loss mask (1 = trained on).

A tokenizer is a ``tokenizer.json`` file or a folder holding one (with ``tokenizer_config.json`` for the
special tokens and chat template), read with the ``tokenizers`` library; no model download, no
transformers needed. Templates:

* ``alpaca`` — the Stanford Alpaca prompt; the response and EOS are trained on;
* ``chatml`` — ``<|im_start|>role\\n...<|im_end|>``; assistant contents and their end marker are trained on;
* ``tokenizer`` — the tokenizer's own chat template (Jinja), split at turn boundaries the way
  ``add_generation_prompt`` does, so only assistant turns are trained on;
* ``plain`` — text as is; everything is trained on;
* ``auto`` — the tokenizer's chat template when it has one, else ``alpaca`` for instruction data, ``chatml``
  for conversations and ``plain`` for text.

Each segment is tokenized on its own and the ids concatenated (the usual SFT convention), so a prompt's
last token never merges with the response's first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.data.errors import DataError
from pitstop.data.examples import Example
from pitstop.data.regular import check_regular, regular_problem

TEMPLATES = ("auto", "alpaca", "chatml", "tokenizer", "plain")
ALPACA_HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    "\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)

Segments = list[tuple[str, bool]]  # (text, trained on)


@dataclass
class TokenizerInfo:
    """Where a tokenizer came from and what a cache key needs to know about it."""

    path: Path
    fingerprint: str
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    chat_template: str | None = None
    vocab_size: int = 0
    config: dict[str, Any] = field(default_factory=dict)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def describe_tokenizer(spec: str | Path) -> TokenizerInfo:
    path = Path(spec)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise DataError(f"{spec}: no tokenizer.json there (pass the file, or a folder that holds it)")
    check_regular(file)  # a FIFO would block the read forever
    data = file.read_bytes()
    config: dict[str, Any] = {}
    config_path = file.with_name("tokenizer_config.json")
    problem = regular_problem(config_path)
    if problem is not None:  # refused rather than skipped: its special tokens and template would be lost
        raise DataError(problem)
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except ValueError as exc:
            raise DataError(f"{config_path}: invalid JSON ({exc})") from None
    try:
        spec_json = json.loads(data)
    except ValueError:
        raise DataError(f"{file}: not a tokenizer.json (invalid JSON)") from None
    vocab = spec_json.get("model", {}).get("vocab") if isinstance(spec_json, dict) else None
    added = spec_json.get("added_tokens", []) if isinstance(spec_json, dict) else []
    size = (len(vocab) if isinstance(vocab, dict | list) else 0) + len(added)
    digest = hashlib.sha256(data + json.dumps(config, sort_keys=True).encode()).hexdigest()
    info = TokenizerInfo(
        path=file,
        fingerprint=digest,
        chat_template=config.get("chat_template"),
        vocab_size=size,
        config=config,
    )
    info.bos = _token_text(config.get("bos_token"))
    info.eos = _token_text(config.get("eos_token"))
    info.pad = _token_text(config.get("pad_token"))
    if info.eos is None:  # a bare tokenizer.json: take the usual names when they exist
        names = {t.get("content") for t in added if isinstance(t, dict)}
        info.eos = next(
            (n for n in ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>") if n in names),
            None,
        )
        info.bos = info.bos or next((n for n in ("<s>", "<|begin_of_text|>", "<bos>") if n in names), None)
        info.pad = info.pad or next((n for n in ("<pad>", "<|pad|>", "[PAD]") if n in names), None)
    return info


def load_tokenizer(info: TokenizerInfo) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - tokenizers comes with the hf extra
        raise DataError("tokenizing needs the `tokenizers` package: pip install 'pitstop[hf]'") from exc
    try:
        tok = Tokenizer.from_file(str(info.path))
    except Exception as exc:
        raise DataError(f"{info.path}: the tokenizers library cannot load it ({exc})") from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def resolve_template(template: str, info: TokenizerInfo, layout: str) -> str:
    if template not in TEMPLATES:
        raise DataError(f"unknown template {template!r}; use one of {', '.join(TEMPLATES)}")
    if template == "tokenizer" and not info.chat_template:
        raise DataError(
            f"{info.path}: the tokenizer has no chat template (tokenizer_config.json chat_template)"
        )
    if template != "auto":
        return template
    if layout == "text":
        return "plain"
    if info.chat_template:
        return "tokenizer"
    return "alpaca" if layout in ("alpaca", "prompt_completion") else "chatml"


class Renderer:
    """Turns an Example into segments for one template (the chat template is compiled once)."""

    def __init__(self, template: str, info: TokenizerInfo) -> None:
        self.template = template
        self.info = info
        self._jinja: Any = None
        if template == "tokenizer" or (template == "auto" and info.chat_template):
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._jinja = env.from_string(info.chat_template or "")

    def segments(self, example: Example) -> Segments:
        kind = resolve_template(self.template, self.info, example.layout)
        eos = self.info.eos or ""
        bos = self.info.bos or ""
        if kind == "plain":
            if example.layout == "text":
                return [(bos + example.turns[0][1] + eos, True)]
            return [
                (f"{content}\n" + (eos if role == "assistant" else ""), role == "assistant")
                for role, content in example.turns
            ]
        if kind == "alpaca":
            segs: Segments = [(bos, False)] if bos else []
            system = "".join(c + "\n\n" for r, c in example.turns if r == "system")
            for role, content in example.turns:
                if role == "user":
                    segs.append((system + ALPACA_HEADER.format(instruction=content), False))
                    system = ""
                elif role == "assistant":
                    segs.append((content + eos, True))
            return segs
        if kind == "chatml":
            segs = []
            for role, content in example.turns:
                if role == "assistant":
                    segs.append(("<|im_start|>assistant\n", False))
                    segs.append((content + "<|im_end|>", True))
                    segs.append(("\n", False))
                else:
                    segs.append((f"<|im_start|>{role}\n{content}<|im_end|>\n", False))
            return segs
        return self._chat_template_segments(example)

    def _render(self, turns: list[tuple[str, str]], generation_prompt: bool) -> str:
        messages = [{"role": r, "content": c} for r, c in turns]
        return str(
            self._jinja.render(
                messages=messages,
                add_generation_prompt=generation_prompt,
                bos_token=self.info.bos or "",
                eos_token=self.info.eos or "",
            )
        )

    def _chat_template_segments(self, example: Example) -> Segments:
        segs: Segments = []
        done = ""
        for i, (role, _) in enumerate(example.turns):
            if role == "assistant":
                header = self._render(example.turns[:i], True)
                if header.startswith(done) and len(header) > len(done):
                    segs.append((header[len(done) :], False))
                    done = header
            text = self._render(example.turns[: i + 1], False)
            if not text.startswith(done):
                raise DataError(
                    "the tokenizer's chat template does not render conversations by prefix; "
                    "use --template chatml or alpaca"
                )
            segs.append((text[len(done) :], role == "assistant"))
            done = text
        return segs


def _raise(message: str) -> None:
    raise DataError(f"chat template: {message}")


def encode(tokenizer: Any, batch: list[Segments]) -> list[tuple[list[int], list[int]]]:
    """Token ids and loss masks for a batch of segmented examples, with one batched tokenizer call."""
    tokens, lengths, mask = encode_arrays(tokenizer, batch)
    out, start = [], 0
    for n in lengths.tolist():
        out.append((tokens[start : start + n].tolist(), mask[start : start + n].tolist()))
        start += n
    return out


def encode_arrays(tokenizer: Any, batch: list[Segments]) -> tuple[Any, Any, Any]:
    """(all token ids back to back as uint32, tokens per example, loss mask as uint8), without building a
    Python list per token: what the cache writes."""
    import itertools

    import numpy as np

    flat = [text for segs in batch for text, _ in segs]
    trained = np.fromiter((t for segs in batch for _, t in segs), dtype=np.uint8, count=len(flat))
    encoded = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
    piece = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.fromiter(
        itertools.chain.from_iterable(e.ids for e in encoded), dtype=np.uint32, count=int(piece.sum())
    )
    mask = np.repeat(trained, piece)
    per_example = np.fromiter((len(segs) for segs in batch), dtype=np.int64, count=len(batch))
    ends = np.cumsum(per_example)
    cumulative = np.concatenate(([0], np.cumsum(piece)))
    lengths = cumulative[ends] - cumulative[ends - per_example]
    return tokens, lengths, mask
