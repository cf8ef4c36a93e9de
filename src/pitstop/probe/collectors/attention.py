"""Which attention ran: SDPA calls in the window (with an explicit mask or not), and, for a model that attends
through torch's ``nn.MultiheadAttention``, the path those calls took."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.profile import RankProfile
from pitstop.probe import environment as envmod
from pitstop.probe.collectors.base import ProbeContext, WindowCounts, collector


@dataclass
class SdpaCalls:
    calls: int = 0
    with_mask: int = 0


@collector
class AttentionCollector(WindowCounts[SdpaCalls]):
    counts_type = SdpaCalls

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.torch_attention = False  # the model attends with torch's nn.MultiheadAttention

    def on_sdpa(self, has_mask: bool) -> None:
        counts = self.counts
        counts.calls += 1
        counts.with_mask += has_mask

    def begin(self) -> None:
        env = self.ctx.environment
        if env is not None and env.attention.implementation is None:
            self.torch_attention = envmod.uses_torch_attention(self.ctx.model)

    def fill(self, draft: RankProfile) -> None:
        attention = draft.environment.attention
        attention.sdpa_calls = self.counts.calls
        attention.sdpa_calls_with_mask = self.counts.with_mask
        if self.torch_attention:
            attention.implementation = envmod.torch_attention_path(self.counts.calls)
