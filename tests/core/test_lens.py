"""The logit lens and direct attribution: read-outs worked by hand, and parts that sum to the logit."""

import numpy as np
import pytest
import torch

from tests.core.test_interventions import tiny_llama
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.lens import direct_attribution, logit_lens

A = [3, 7, 1, 12, 9, 4]
TGT = [1, 5, 9, 2, 17]

CASES = {
    "gpt2": (lambda: tiny_decoder().double(), lambda m: m.trace(A)),
    "llama": (lambda: tiny_llama().double(), lambda m: m.trace(A)),
    "seq2seq-pre": (lambda: tiny_seq2seq(norm="pre").double(), lambda m: m.trace(A, TGT)),
    "seq2seq-post": (lambda: tiny_seq2seq().double(), lambda m: m.trace(A, TGT)),
    "deit": (lambda: tiny_vit().double(), lambda m: m.trace(image().double())),
    "vit": (lambda: tiny_vit(distilled=False).double(), lambda m: m.trace(image().double())),
}


@pytest.mark.parametrize("case", CASES)
def test_the_lens_last_row_is_the_models_own_prediction(case):
    build, run = CASES[case]
    model = build()
    trace = run(model)
    lens = logit_lens(model, trace, k=3)
    ids, probs = trace.ranked(3)
    np.testing.assert_array_equal(lens.top_ids[-1], ids)
    np.testing.assert_allclose(lens.top_probs[-1], probs, rtol=1e-6)
    assert lens.layers[0] == "embed" and len(lens.layers) == trace.layers_in(trace.attention_stacks[-1]) + 1
    assert lens.rank[-1] == 0 and lens.target == ids[0]


def test_the_lens_reads_a_middle_layer_through_the_final_norm_and_the_unembedding_by_hand():
    model = tiny_decoder().double()
    trace = model.trace(A)
    x = np.asarray(trace["decoder.0.resid_post"][-1])  # after layer 0, at the last position
    ln = model.weights().ln_final
    normed = (x - x.mean()) / np.sqrt(x.var() + ln.eps) * ln.w.numpy() + ln.b.numpy()
    logits = normed @ model.weights().W_E.numpy().T  # GPT-2 ties the unembedding to the embedding
    p = np.exp(logits - logits.max())
    p /= p.sum()
    target = 11
    lens = logit_lens(model, trace, k=4, target=target)
    np.testing.assert_array_equal(lens.top_ids[1], np.argsort(-p, kind="stable")[:4])
    np.testing.assert_allclose(lens.prob[1], p[target], rtol=1e-10)
    assert lens.rank[1] == int((p > p[target]).sum())


@pytest.mark.parametrize("case", ["gpt2", "llama", "seq2seq-pre", "deit", "vit"])
def test_direct_attribution_parts_sum_to_the_logit(case):
    build, run = CASES[case]
    model = build()
    trace = run(model)
    logits = np.asarray(trace["head.logits"], dtype=np.float64)
    last = logits if logits.ndim == 1 else logits[-1]  # the image's, or the last position's
    for output in (None, 2):
        parts = direct_attribution(model, trace, output)
        assert parts.output == (int(np.argmax(last)) if output is None else output)
        # the sum of the parts is the logit the forward pass computed (read from the trace, not from the parts)
        assert parts.total == pytest.approx(last[parts.output], abs=1e-9) and parts.logit == last[parts.output]
        assert parts.heads.shape == (2 if case != "seq2seq-pre" else 3, 4)
        assert (parts.cross is not None) == case.startswith("seq2seq")
        assert np.abs(parts.heads).max() > 1e-6  # the heads do contribute: the test sums real parts


def test_a_heads_direct_attribution_by_hand_with_the_norm_frozen():
    model = tiny_decoder().double()
    trace = model.trace(A)
    parts = direct_attribution(model, trace, output=7)
    w = model.weights()
    x = np.asarray(trace["decoder.1.resid_post"][-1])
    scale = np.sqrt(x.var() + w.ln_final.eps)
    c = np.asarray(trace.block("z", 1, 2)[-1]) @ w.block(1).attn.W_O[2].numpy()  # head 2 of layer 1 at the last token
    expected = ((c - c.mean()) / scale * w.ln_final.w.numpy()) @ w.W_E[7].numpy()
    assert parts.heads[1, 2] == pytest.approx(expected, rel=1e-10)
    assert parts.scale == (pytest.approx(scale, rel=1e-12),)


def test_post_norm_models_refuse_direct_attribution_and_models_without_a_head_refuse_the_lens():
    model = tiny_seq2seq().double()
    with pytest.raises(
        ValueError, match=r"^this model normalises after every block \(post-norm\): its residual stream is not a sum"
    ):
        direct_attribution(model, model.trace(A, TGT))
    encoder = tiny_encoder()
    with pytest.raises(ValueError, match=r"^this encoder model has no head to read its residual stream with$"):
        logit_lens(encoder, encoder.trace(A))


def test_the_lens_works_on_a_compact_trace_and_a_float32_model():
    model = tiny_decoder()
    trace = model.trace(A)
    compact = trace.compact()
    with torch.inference_mode():
        lens = logit_lens(model, compact)
    np.testing.assert_array_equal(lens.top_ids[-1], trace.ranked(5)[0])
    parts = direct_attribution(model, compact)
    assert parts.total == pytest.approx(parts.logit, abs=1e-4)
