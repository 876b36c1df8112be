"""Compact traces (what a server caches) give the same answers as full ones, from less memory.

A compact trace drops the attention weights and scores and recomputes them from the stored Q and K
when read (and a trace captured without head outputs recomputes those from the weights and V); these
tests compare every recomputed part with the tensor the forward pass itself produced, for every model
kind, in float32 as the app runs them.
"""

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import D, H, image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.trace import lean

SRC = [3, 7, 1, 12, 9, 4, 0, 0]
SRC_MASK = [1, 1, 1, 1, 1, 1, 0, 0]
TGT = [1, 5, 9, 2, 17]


def tiny_t5():
    torch.manual_seed(0)
    config = tc.Seq2SeqConfig(
        src_vocab_size=30,
        tgt_vocab_size=35,
        max_positions=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_model=D,
        n_heads=H,
        d_ff=32,
        norm="pre",
        norm_type="rmsnorm",
        positional="none",
        rel_pos_buckets=8,
        scale_attention=False,
    )
    return tc.EncoderDecoder(config)


RUNS = {
    "encoder-padded": (tiny_encoder, lambda m, keep: m.trace(SRC, attention_mask=SRC_MASK, keep=keep)),
    "decoder-padded": (tiny_decoder, lambda m, keep: m.trace(TGT + [8, 8], attention_mask=[1] * 5 + [0, 0], keep=keep)),
    "seq2seq": (tiny_seq2seq, lambda m, keep: m.trace(SRC, TGT, source_mask=SRC_MASK, keep=keep)),
    "t5-relative-bias": (tiny_t5, lambda m, keep: m.trace(SRC[:6], TGT, keep=keep)),
    "vit": (tiny_vit, lambda m, keep: m.trace(image(), keep=keep)),
}


def everything(name: str) -> bool:
    return True


@pytest.fixture(scope="module", params=list(RUNS))
def full_and_compact(request):
    build, run = RUNS[request.param]
    model = build()
    full = run(model, everything)  # every hook's tensor as the forward pass computed it
    compact = run(model, lean).compact()  # captured lean, as the app does, then compacted
    without_z = run(model, lambda name: lean(name) and not name.endswith(".z")).compact()
    return full, compact, without_z


def test_recomputed_attention_equals_what_the_forward_pass_computed(full_and_compact):
    full, compact, without_z = full_and_compact
    checked = 0
    for stack in full.attention_stacks:
        for layer in range(full.layers_in(stack)):
            for part, trace in (("scores", compact), ("scaled", compact), ("weights", compact), ("z", without_z)):
                stored = full.block(part, layer, stack=stack)
                assert f"{full._block(stack, layer)}.{part}" not in trace.activations
                recomputed = trace.block(part, layer, stack=stack)
                assert recomputed.shape == stored.shape and recomputed.dtype == stored.dtype
                finite = np.isfinite(stored)
                assert np.array_equal(finite, np.isfinite(recomputed))  # the same cells masked (-inf)
                np.testing.assert_allclose(recomputed[finite], stored[finite], rtol=1e-5, atol=1e-6)
                for head in (0, full.n_heads - 1, -1):  # one head alone is what a view change reads
                    np.testing.assert_allclose(
                        trace.block(part, layer, head, stack), recomputed[head], rtol=1e-6, atol=1e-7
                    )
                checked += 1
    assert checked == 4 * sum(full.layers_in(s) for s in full.attention_stacks)


def test_a_compact_trace_offers_the_same_names_and_predictions(full_and_compact):
    full, compact, _ = full_and_compact
    # The same names, both ways (these vocabularies are small enough for the compact trace to keep the logits).
    assert sorted(compact.names) == sorted(full.names)
    if full.has_head:
        assert compact.has_head
        for position in [None] if full["head.logits"].ndim == 1 else range(len(full["head.logits"])):
            ids, probs = full.ranked(5, position)
            got_ids, got_probs = compact.ranked(5, position)
            np.testing.assert_array_equal(got_ids, ids)
            np.testing.assert_allclose(got_probs, probs, rtol=1e-6)


def test_compact_keeps_less_memory(full_and_compact):
    full, compact, _ = full_and_compact
    assert compact.nbytes < full.nbytes
    for name in compact.activations:
        assert not name.endswith((".weights", ".scores", ".scaled"))
    assert "encoder.0.attn.z" in compact.activations or "decoder.0.attn.z" in compact.activations


def test_masked_rows_that_see_nothing_are_zero_as_in_the_model():
    """A padding query under causal + padding masks attends to nothing: the model writes 0, not NaN."""
    model = tiny_decoder()
    trace = model.trace([1, 5, 9], attention_mask=[0, 1, 1], keep=lean).compact()
    weights = trace.attention(0)
    assert not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[:, 0], 0.0)  # the first query may see only itself, a padding key
    np.testing.assert_allclose(weights[:, 1:].sum(-1), 1.0, rtol=1e-6)


def test_a_vocabulary_head_keeps_each_positions_top_tokens():
    model = tiny_decoder()
    full = model.trace(TGT)
    compact = full.compact(top_k=7)
    assert "head.logits" not in compact.activations
    assert compact["head.top_ids"].shape == (len(TGT), 7) and compact["head.top_probs"].dtype == np.float32
    logits = full["head.logits"]
    for position in range(len(TGT)):
        expected = np.argsort(-logits[position], kind="stable")[:7]
        np.testing.assert_array_equal(compact["head.top_ids"][position], expected)
        assert compact.predictions(3, position) == [
            (label, pytest.approx(p, rel=1e-6)) for label, p in full.predictions(3, position)
        ]
    assert len(compact.predictions(20, 0)) == 7  # asking for more than it kept gives what it kept


def test_compact_copies_a_row_of_a_batch_so_the_batch_can_be_freed():
    vit = tiny_vit()
    batch = torch.stack([image(0), image(1), image(2)])
    traces = vit.trace_batch(batch, keep=lean)
    one = traces[1].compact()
    for name, tensor in one.activations.items():
        # owns its memory, no longer a view of the batch
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
    # Before compacting, a row of the batch keeps the whole batch's buffers alive (and counts them); the position
    # table, expanded over the batch, is not a row of it: it counts once either way.
    assert traces[1].nbytes == 3 * (one.nbytes - one.activations["encoder.embed.pos"].nbytes) + 896
    assert one.activations["encoder.embed.pos"].nbytes == 896
    # A tensor recorded under two names (a layer's output, the next one's input) is still one tensor.
    assert one.activations["encoder.0.resid_post"] is one.activations["encoder.1.resid_pre"]
    np.testing.assert_allclose(one.attention(1), vit.trace(image(1)).attention(1), rtol=1e-5, atol=1e-6)


def test_keep_drops_what_the_caller_never_reads():
    trace = tiny_encoder().trace(SRC[:5]).compact(keep=lambda name: ".mlp." not in name)
    assert not [n for n in trace.activations if ".mlp." in n]
    assert "encoder.0.attn.q" in trace.activations


def test_top_tokens_are_found_a_few_positions_at_a_time_with_the_same_answer():
    """A long input's logits become top-k ids and probabilities TOP_K_ROWS positions at a time (the whole table's
    float64 softmax and sort took 300 MB for smollm2): the same numbers as over the whole table, ties included."""
    from tformer_core.numerics import softmax
    from tformer_core.trace import TOP_K_ROWS, top_k_tokens

    logits = np.random.default_rng(0).normal(size=(3 * TOP_K_ROWS + 5, 300)).astype(np.float32)
    logits[:, 10] = logits[:, 11] = logits.max(1) + 1  # a tie at the top: the lower id comes first, as before
    ids, probs = (t.numpy() for t in top_k_tokens(torch.from_numpy(logits), 7))  # on the logits' device
    assert ids.dtype == np.int32 and probs.dtype == np.float32
    whole = softmax(logits)
    expected = np.argsort(-whole, axis=-1, kind="stable")[:, :7]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(probs, np.take_along_axis(whole, expected, -1), rtol=1e-6)
    assert (ids[:, :2] == [10, 11]).all()


def test_a_continuations_final_pass_stores_only_what_its_steps_store():
    """generate(keep=...) filtered the steps but not the final teacher-forced pass, which then held every
    intermediate: for smollm2 at 270 tokens, 300 MB more for each continuation while it was computed."""
    keep = lambda name: name.endswith(".attn.weights") or name == "head.logits"  # noqa: E731
    model = tiny_decoder()
    gen = model.generate([3, 9, 4], 5, keep=keep)
    assert gen.trace.activations and all(keep(name) for name in gen.trace.activations)
    assert all(keep(name) for step in gen.steps for name in step.activations)
    # A caller that reads only the steps (the Text attention page) asks for no final pass at all.
    lean = model.generate([3, 9, 4], 5, keep=keep, final_trace=False)
    assert lean.trace is None and lean.tokens == gen.tokens and lean.ids == gen.ids
    for a, b in zip(lean.steps, gen.steps):
        np.testing.assert_array_equal(a["head.logits"], b["head.logits"])
