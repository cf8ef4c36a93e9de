"""Where the job pads every example to a fixed length: a tokenizer call with ``padding="max_length"``.

Watched from the probe's installation on (``trials.padding_calls``: a dict lookup per tokenizer call, no
per-step work). The rows' width alone says the batches are all one width; this says who made them so, and
on which line of the job, so ``padding_waste`` can advise the one-line change in the job's own code. A job
that tokenized before torch was imported (or read its tokenized rows from a cache) leaves it unseen: the
rule then falls back to the batches' widths and the collator's name.
"""

from __future__ import annotations

from pitstop.core.profile import RankProfile
from pitstop.probe.bootstrap import after_import
from pitstop.probe.collectors.base import Collector, collector
from pitstop.trials import padding_calls

TOKENIZER_MODULE = "transformers.tokenization_utils_base"


@collector
class TokenizerPaddingCollector(Collector):
    def install(self) -> None:
        after_import(TOKENIZER_MODULE, padding_calls.watch)

    def fill(self, draft: RankProfile) -> None:
        call = padding_calls.seen()
        if call is None:
            return
        loader = draft.environment.dataloader
        loader.tokenizer_pads_to = call.pads_to
        loader.tokenizer_padding_site = call.site
        loader.tokenizer_padding_code = call.code
