"""Induction heads: the score and the repeats' losses worked by hand, the sequence drawn as promised, and the
ablated losses one batched pass equal to one pass per set of heads."""

import numpy as np
import pytest
import torch

from tests.core.test_interventions import tiny_llama
from tformer_core import induction as ind
from tformer_core.interventions import Head, ablate_heads
from tformer_views import induction as iv

# prefix of 1 (a BOS), 3 tokens, twice: positions 0 | 1 2 3 | 4 5 6
SEQ = ind.RepeatedTokens(ids=(0, 5, 6, 7, 5, 6, 7), prefix=1, length=3, repeats=2, seed=0)


def _causal_uniform(n):
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def test_the_induction_score_averages_the_second_repeats_attention_to_the_token_after_the_previous_occurrence():
    rng = np.random.default_rng(0)
    n = len(SEQ.ids)
    random = np.tril(rng.random((n, n)))
    random /= random.sum(axis=1, keepdims=True)
    perfect = np.zeros((n, n))
    perfect[0, 0] = perfect[1, 1] = perfect[2, 1] = perfect[3, 1] = 1.0
    perfect[[4, 5, 6], [2, 3, 4]] = 1.0  # 5 at 4 -> the 6 after the first 5; 6 at 5 -> 7; 7 at 6 -> the second 5
    attention = np.stack([perfect, _causal_uniform(n), random])  # [heads, T, T]
    scores = ind.induction_scores(attention, SEQ)
    assert scores[0] == 1.0
    assert scores[1] == pytest.approx((1 / 5 + 1 / 6 + 1 / 7) / 3)  # query q sees q + 1 keys, 1 / (q + 1) each
    assert scores[2] == pytest.approx((random[4, 2] + random[5, 3] + random[6, 4]) / 3)
    moved = attention.copy()
    moved[2, 3, 1] += 5.0  # a query of the first repeat, and cells off the stripe, count for nothing
    moved[2, 6, 6] += 5.0
    assert ind.induction_scores(moved, SEQ)[2] == scores[2]
    assert ind.induction_scores(attention[None], SEQ).shape == (1, 3)  # [layers, heads, T, T] -> [layers, heads]
    with pytest.raises(
        ValueError, match=r"^attention of shape \(3, 6, 6\) does not match the 7 tokens of the sequence$"
    ):
        ind.induction_scores(attention[:, :6, :6], SEQ)


def test_the_loss_of_a_repeat_is_the_cross_entropy_of_its_tokens_but_the_first():
    vocab = 9
    logits = np.random.default_rng(1).normal(size=(len(SEQ.ids), vocab))
    losses = ind.token_losses(logits, SEQ.ids)
    by_hand = [np.log(np.exp(logits[p]).sum()) - logits[p, SEQ.ids[p + 1]] for p in range(len(SEQ.ids) - 1)]
    np.testing.assert_allclose(losses, by_hand, rtol=1e-12)
    marked = np.arange(len(SEQ.ids) - 1, dtype=float)  # loss p: predicting the token at position p + 1
    assert ind.repeat_loss(marked, SEQ, 0) == (1 + 2) / 2  # tokens at 2, 3 (the first repeat's 1 left out)
    assert ind.repeat_loss(marked, SEQ, 1) == (4 + 5) / 2  # tokens at 5, 6 (the second repeat's 4 left out)
    np.testing.assert_array_equal(ind.repeat_loss(np.stack([marked, 2 * marked]), SEQ, 1), [4.5, 9.0])
    assert list(SEQ.positions(1)) == [4, 5, 6]


class _Stub:
    """A tokenizer that puts a BOS (1) before any text and whose decode leaves out the special ids 0..3."""

    def encode(self, text):
        return [1]

    def decode(self, ids):
        return "" if ids[0] < 4 else f"t{ids[0]}"


def test_the_sequence_is_the_tokenizers_prefix_then_distinct_ordinary_random_tokens_twice():
    model = tiny_llama()
    model.generation = type(model.generation)(eos_id=39)
    plain = ind.repeated_tokens(model, 10, seed=3)
    assert plain.prefix == 0 and plain.ids[:10] == plain.ids[10:] and len(set(plain.ids)) == 10
    assert 39 not in plain.ids and plain == ind.repeated_tokens(model, 10, seed=3)
    assert plain.ids != ind.repeated_tokens(model, 10, seed=4).ids
    model.tokenizer = _Stub()
    seq = ind.repeated_tokens(model, 12, seed=3)
    assert seq.ids[0] == 1 and seq.prefix == 1 and seq.ids[1:13] == seq.ids[13:]
    assert not set(seq.ids[1:]) & {0, 1, 2, 3, 39}
    with pytest.raises(ValueError, match=r"^2 x 16 tokens do not fit in one pass of this model \(32 tokens\)$"):
        ind.repeated_tokens(model, 16, seed=0)  # 1 + 32 > 32 positions


def test_ablated_losses_in_one_batch_equal_one_pass_per_set_of_heads(monkeypatch):
    model = tiny_llama().double()
    seq = ind.repeated_tokens(model, 8, seed=0)
    sets = [[], [Head("decoder", 1, 2)], [Head("decoder", 0, 0), Head("decoder", 1, 3)]]
    for row_tokens in (512, 17):  # one pass; one row a pass
        monkeypatch.setattr(ind, "ROW_TOKENS", row_tokens)
        batched = ind.ablated_losses(model, seq, sets)
        for heads, row in zip(sets, batched, strict=True):
            with torch.inference_mode(), model.intervene(ablate_heads(heads)):
                single = ind.token_losses(model(torch.tensor([seq.ids]))[0], seq.ids)
            np.testing.assert_allclose(row, single, rtol=1e-10)
    assert not np.allclose(batched[0], batched[1])
    with pytest.raises(ValueError, match=r"^decoder L2 H0 is not a head of this model \(2 layers x 4 heads\)$"):
        ind.ablated_losses(model, seq, [[Head("decoder", 2, 0)]])


def test_the_study_scores_the_traced_attention_and_its_ablation_rows_are_clean_top_and_random_heads():
    model = tiny_llama().double()
    found = iv.study(model, 8, 5)
    trace = model.trace(list(found.seq.ids))
    np.testing.assert_allclose(found.scores, ind.induction_scores(trace.all_attention("decoder"), found.seq))
    assert found.second == pytest.approx(float(ind.repeat_loss(found.losses, found.seq, 1)))
    top = found.top(3)
    assert [found.scores[h.layer, h.head] for h in top] == sorted(found.scores.ravel())[::-1][:3]
    tested = iv.ablation(model, 8, 5, top)
    assert len(tested.draws) == iv.DRAWS and all(len(d) == 3 and not set(d) & set(top) for d in tested.draws)
    np.testing.assert_allclose(tested.losses[0], found.losses, rtol=1e-9)
    assert tested.second[0] == pytest.approx(found.second)
    table = iv.loss_table(found, tested)
    # no prefix: the token at 0 is not predicted; that at 8 (the second repeat's first) is, but left out
    assert list(table["position"][[0, 7, 8]]) == [1, 8, 9]
    assert list(table["counted in"][[0, 6, 7, 8, 14]]) == ["repeat 1", "repeat 1", "-", "repeat 2", "repeat 2"]
    np.testing.assert_allclose(table["top 3 ablated"], tested.losses[1])
