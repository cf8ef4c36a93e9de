"""torch's own nn.MultiheadAttention called with need_weights=True is eager attention: the rule finds it and
the fix is the call's argument (need_weights=False), not a loading argument the module does not have."""

from __future__ import annotations

from tests.unit.test_rules import finding, profile, steps

from pitstop.core.profile import AttentionInfo


def test_multihead_attention_with_weights_is_eager_and_the_fix_is_need_weights_false() -> None:
    p = profile(
        "cpu",
        steps(row_len=512),
        attention=AttentionInfo(
            implementation="eager (nn.MultiheadAttention with need_weights=True)", sdpa_calls=0
        ),
    )
    f = finding(p, "slow_attention")
    assert f is not None and f.confidence >= 0.7
    assert "need_weights=True" in f.summary
    assert f.evidence["attn_implementation"].startswith("eager (nn.MultiheadAttention")
    snippets = " ".join(f.fix.snippets.values())
    assert "need_weights=False" in snippets and "attn_implementation" not in snippets


def test_multihead_attention_on_the_fused_path_is_quiet() -> None:
    p = profile(
        "cpu",
        steps(row_len=512),
        attention=AttentionInfo(implementation="sdpa (nn.MultiheadAttention)", sdpa_calls=24),
    )
    assert finding(p, "slow_attention") is None
