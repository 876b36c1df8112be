"""Head importance by ablation: the batched, branched passes give what one pass per head gives, on every kind."""

import numpy as np
import pytest
import torch

from tests.core.test_interventions import tiny_llama
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core import probes
from tformer_core.interventions import Head, ablate_heads

A = [3, 7, 1, 12, 9, 4]
B = [5, 2, 8, 11, 6]
TGT = [1, 5, 9, 2, 17]

PROBES = {
    "gpt2": lambda: probes.next_token_probe(tiny_decoder().double(), A),
    "llama": lambda: probes.next_token_probe(tiny_llama().double(), A, token=7),
    "translator": lambda: probes.translation_probe(tiny_seq2seq().double(), A, TGT),
    "translator-pre": lambda: probes.translation_probe(tiny_seq2seq(norm="pre").double(), A, TGT),
    "deit": lambda: probes.class_probe(tiny_vit().double(), image().double()),
    "minilm-like": lambda: probes.similarity_probe(tiny_encoder().double(), A, B),
}


def _one_by_one(probe, how):
    clean = float(probe.measure()[0])
    scores = {}
    for stack, (layers, heads) in probe.heads.items():
        scores[stack] = np.array(
            [[probe.measure(ablate_heads([Head(stack, l, h)], how))[0] for h in range(heads)] for l in range(layers)]
        )
    return clean, scores


@pytest.mark.parametrize("how", ["zero", "mean"])
@pytest.mark.parametrize("kind", PROBES)
def test_batched_head_importance_equals_one_pass_per_head(kind, how, monkeypatch):
    probe = PROBES[kind]()
    clean, expected = _one_by_one(probe, how)
    result = probes.head_importance(probe, how)
    assert result.passes == (2 if kind.startswith("translator") else 1)
    monkeypatch.setattr(probes, "ROW_TOKENS", 5 * probe.tokens)  # 4 heads a layer: one layer per pass
    split = probes.head_importance(probe, how)
    assert split.passes == sum(layers for stack, (layers, _) in probe.heads.items() if stack != "cross")
    for r in (result, split):
        assert r.clean == pytest.approx(clean, abs=1e-12)
        assert set(r.scores) == set(expected)
        for stack in expected:
            np.testing.assert_allclose(r.scores[stack], expected[stack], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(r.effects[stack], clean - expected[stack], rtol=1e-9, atol=1e-12)
    # Some head matters, so the test compares numbers. (The tiny post-norm encoder attends almost uniformly: each
    # head's z is nearly its mean at every position, and mean-ablating changes next to nothing there.)
    if how == "zero" or kind != "minilm-like":
        assert max(abs(e).max() for e in result.effects.values()) > 1e-6


def test_the_probe_scores_are_the_models_own_probabilities():
    model = tiny_decoder().double()
    probe = probes.next_token_probe(model, A)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([A]))[0, -1], -1)
    assert probe.measure()[0] == pytest.approx(float(p.max()), rel=1e-12)
    assert probe.what.startswith("p(")
    encoder = tiny_encoder().double()
    sim = probes.similarity_probe(encoder, A, B)
    with torch.no_grad():
        ea, eb = encoder(torch.tensor([A]))[0].mean(0), encoder(torch.tensor([B]))[0].mean(0)
    assert sim.measure()[0] == pytest.approx(float(torch.cosine_similarity(ea, eb, dim=0)), rel=1e-12)


def test_ranked_puts_the_largest_drop_first_and_bad_requests_are_refused():
    result = probes.head_importance(PROBES["gpt2"]())
    ranked = result.ranked()
    effects = result.effects["decoder"]  # [2 layers, 4 heads]
    assert effects.shape == (2, 4) and len(ranked) == 8
    # Every head once, each with its own effect, in order of decreasing effect (the largest drop first).
    assert dict(ranked) == {Head("decoder", l, h): float(effects[l, h]) for l in range(2) for h in range(4)}
    assert [effect for _, effect in ranked] == sorted(effects.ravel().tolist(), reverse=True)
    with pytest.raises(ValueError, match=r"^how must be one of \('zero', 'mean'\), got 'noise'$"):
        probes.head_importance(PROBES["gpt2"](), how="noise")
