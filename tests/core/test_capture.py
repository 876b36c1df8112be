"""Invariants on every captured attention block of every model kind, and capture's side effects."""

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.capture import any_of, capture_active, matching

SRC = [3, 7, 1, 12, 9, 4, 0, 0]  # the last two are padding
SRC_MASK = [1, 1, 1, 1, 1, 1, 0, 0]
TGT = [1, 5, 9, 2, 17]


def store_everything(name: str) -> bool:
    return True


# How each model kind is run: (name, model builder, trace call). The invariants below are checked on
# traces that store every hook's tensor as the forward pass computed it (scores and scaled included),
# so "scores = Q K^T" compares two tensors the model produced, not a trace's recomputation with itself.
RUNS = {
    "encoder-post": (
        lambda: tiny_encoder().double(),
        lambda m, keep: m.trace(SRC, attention_mask=SRC_MASK, token_type_ids=[0] * 4 + [1] * 4, keep=keep),
    ),
    "encoder-pre": (
        lambda: tiny_encoder(norm="pre", positional="sinusoidal").double(),
        lambda m, keep: m.trace(SRC[:6], keep=keep),
    ),
    "decoder": (
        lambda: tiny_decoder().double(),
        lambda m, keep: m.trace(TGT + [8, 8], attention_mask=[1] * 5 + [0, 0], keep=keep),
    ),
    "seq2seq-post": (
        lambda: tiny_seq2seq().double(),
        lambda m, keep: m.trace(SRC, TGT, source_mask=SRC_MASK, keep=keep),
    ),
    "seq2seq-pre": (lambda: tiny_seq2seq(norm="pre").double(), lambda m, keep: m.trace(SRC[:6], TGT, keep=keep)),
    "vit": (lambda: tiny_vit().double(), lambda m, keep: m.trace(image().double(), keep=keep)),
}
MODELS = {name: build() for name, (build, _) in RUNS.items()}
TRACES = {name: (RUNS[name][1](model, store_everything), model) for name, model in MODELS.items()}
PADDED = {"encoder-post": SRC_MASK, "seq2seq-post": SRC_MASK}


def _blocks(trace, model):
    """Every attention block: (stack, layer, module, trace prefix)."""
    for stack in trace.attention_stacks:
        root = model.decoder if stack in ("decoder", "cross") else model.encoder
        for layer in range(trace.layers_in(stack)):
            block = root.blocks[layer]
            attn = block.cross_attn if stack == "cross" else block.attn
            prefix = (
                f"{'decoder' if stack == 'cross' else stack}.{layer}.{'cross_attn' if stack == 'cross' else 'attn'}"
            )
            yield stack, layer, attn, prefix


def _softmax(x):
    x = x - np.max(np.where(np.isneginf(x), -np.inf, x), axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("name", list(TRACES))
def test_attention_invariants_on_every_block(name):
    trace, model = TRACES[name]
    checked = 0
    for stack, _layer, attn, prefix in _blocks(trace, model):
        q, k, v = trace[f"{prefix}.q"], trace[f"{prefix}.k"], trace[f"{prefix}.v"]
        scores, scaled, w, z = trace.fetch(*(f"{prefix}.{p}" for p in ("scores", "scaled", "weights", "z")))
        n_q, n_k = trace.tokens_for(stack)[0].__len__(), trace.tokens_for(stack)[1].__len__()
        assert w.shape == (trace.n_heads, n_q, n_k)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)  # rows sum to 1
        np.testing.assert_allclose(scores, q @ k.transpose(0, 2, 1), atol=1e-12)  # scores = Q K^T
        finite = np.isfinite(scaled)
        np.testing.assert_allclose(scaled[finite], (scores / np.sqrt(q.shape[-1]))[finite], atol=1e-12)
        np.testing.assert_allclose(_softmax(scaled), w, atol=1e-12)  # weights = softmax(scaled)
        np.testing.assert_allclose(w @ v, z, atol=1e-12)  # head output = weights V
        concat = z.transpose(1, 0, 2).reshape(n_q, -1)
        W_o, b_o = attn.W_o.weight.detach().numpy(), attn.W_o.bias.detach().numpy()
        np.testing.assert_allclose(concat @ W_o.T + b_o, trace[f"{prefix}.out"], atol=1e-12)  # concat(Z) W^O
        if stack in ("decoder",):
            assert np.all(np.triu(w, k=1) == 0), "causal weights must be 0 above the diagonal"
            assert np.all(np.isneginf(scaled[:, np.triu_indices(n_q, 1)[0], np.triu_indices(n_q, 1)[1]]))
        if stack == "cross":
            assert w.shape[1:] == (len(TGT), len(trace.tokens))  # [tgt, src]
        checked += 1
    assert checked == sum(trace.layers_in(s) for s in trace.attention_stacks)


@pytest.mark.parametrize("name", list(PADDED))
def test_padding_keys_get_zero_weight(name):
    trace, model = TRACES[name]
    padded = np.array(PADDED[name]) == 0
    for stack, _, _, prefix in _blocks(trace, model):
        if stack in ("encoder", "cross"):
            assert np.all(trace[f"{prefix}.weights"][..., padded] == 0)
            assert np.all(np.isneginf(trace[f"{prefix}.scaled"][..., padded]))


@pytest.mark.parametrize("name", list(TRACES))
def test_q_k_v_are_the_projections_of_the_block_input(name):
    trace, model = TRACES[name]
    for stack, layer, attn, prefix in _blocks(trace, model):
        block_prefix = prefix.rsplit(".", 1)[0]
        pre_norm = model.config.norm == "pre"
        if stack == "cross":
            x_q = trace[f"{block_prefix}.ln_cross"] if pre_norm else trace[f"{block_prefix}.resid_after_attn"]
            x_kv = trace["encoder.out"]  # K and V come from the encoder output
        else:
            x_q = trace[f"{block_prefix}.ln_attn"] if pre_norm else trace[f"{block_prefix}.resid_pre"]
            x_kv = x_q
        for part, W, x in (("q", attn.W_q, x_q), ("k", attn.W_k, x_kv), ("v", attn.W_v, x_kv)):
            proj = x @ W.weight.detach().numpy().T + W.bias.detach().numpy()  # [n, h*dh]
            heads = proj.reshape(len(x), trace.n_heads, -1).transpose(1, 0, 2)
            np.testing.assert_allclose(trace[f"{prefix}.{part}"], heads, atol=1e-12)
        h0 = trace.q(layer, 0, stack)
        assert h0.shape == (len(x_q), model.config.head_dim)


def _layer_norm(x, ln):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * ln.weight.detach().numpy() + ln.bias.detach().numpy()


@pytest.mark.parametrize("name", list(TRACES))
def test_residual_stream_and_layer_norm_placement(name):
    trace, model = TRACES[name]
    for stack, layer, _, prefix in _blocks(trace, model):
        if stack == "cross":
            continue
        p = prefix.rsplit(".", 1)[0]
        block = (model.decoder if stack == "decoder" else model.encoder).blocks[layer]
        x, attn_out = trace[f"{p}.resid_pre"], trace[f"{p}.attn.out"]
        if model.config.norm == "pre":
            np.testing.assert_allclose(trace[f"{p}.ln_attn"], _layer_norm(x, block.ln_attn), atol=1e-10)
            np.testing.assert_allclose(trace[f"{p}.resid_after_attn"], x + attn_out, atol=1e-12)
        else:
            np.testing.assert_allclose(
                trace[f"{p}.resid_after_attn"], _layer_norm(x + attn_out, block.ln_attn), atol=1e-10
            )
        last = f"{p}.resid_after_cross" if f"{p}.resid_after_cross" in trace else f"{p}.resid_after_attn"
        mid, mlp = trace[last], trace[f"{p}.mlp.out"]
        expected = mid + mlp if model.config.norm == "pre" else _layer_norm(mid + mlp, block.ln_mlp)
        np.testing.assert_allclose(trace[f"{p}.resid_post"], expected, atol=1e-10)
        if layer + 1 < trace.layers_in(stack):
            np.testing.assert_array_equal(trace[f"{stack}.{layer + 1}.resid_pre"], trace[f"{p}.resid_post"])


def test_embeddings_and_positional_encodings_are_captured():
    trace, model = TRACES["encoder-pre"]  # sinusoidal positions; BERT-style LayerNorm on the embedding sum
    np.testing.assert_array_equal(trace["encoder.embed.pos"], tc.sinusoidal_encoding(6, 16))
    np.testing.assert_array_equal(trace["encoder.embed.tok"], model.encoder.embed.tok.weight.detach().numpy()[SRC[:6]])
    segment_a = model.encoder.embed.segment.weight.detach().numpy()[0]  # no token_type_ids given: all segment A
    np.testing.assert_array_equal(trace["encoder.embed.segment"], np.tile(segment_a, (6, 1)))
    embedded = trace["encoder.embed.tok"] + trace["encoder.embed.pos"] + segment_a
    np.testing.assert_allclose(trace["encoder.embed.out"], _layer_norm(embedded, model.encoder.embed.ln), atol=1e-12)
    vit_trace, vit = TRACES["vit"]
    c = vit.config
    assert vit_trace["encoder.embed.patches"].shape == (c.n_patches, 3 * 4 * 4) == (12, 48)  # N = HW/P^2 = 12*16/16
    assert vit_trace["encoder.embed.tokens"].shape == (2 + 12, 16)  # class + distillation token + patches
    assert vit_trace.grid_hw == (3, 4) and vit_trace.patch_size == 4 and vit_trace.n_prefix_tokens == 2
    # Patch (row 1, col 2) is pixels [4:8, 8:12], flattened channel-first.
    img = image().double().numpy()
    np.testing.assert_array_equal(vit_trace["encoder.embed.patches"][1 * 4 + 2], img[:, 4:8, 8:12].reshape(-1))
    assert vit_trace.tokens[:3] == ("[CLS]", "[DIST]", "r0c0") and vit_trace.tokens[-1] == "r2c3"


def test_exact_list_of_captured_names():
    model = tiny_encoder(n_layers=1)
    block = [
        "resid_pre",
        "attn.q",
        "attn.k",
        "attn.v",
        "attn.scores",
        "attn.scaled",
        "attn.weights",
        "attn.z",
        "attn.out",
        "ln_attn",
        "resid_after_attn",
        "mlp.hidden",
        "mlp.out",
        "ln_mlp",
        "resid_post",
    ]
    expected = ["encoder.embed.tok", "encoder.embed.pos", "encoder.embed.segment", "encoder.embed.out"]
    expected += [f"encoder.0.{n}" for n in block] + ["encoder.out"]
    trace = model.trace([1, 2, 3])
    assert trace.names == expected
    stored = set(trace.activations)
    assert stored == set(expected) - {"encoder.0.attn.scores", "encoder.0.attn.scaled"}  # recomputed on demand
    s2s = tiny_seq2seq()
    names = set(s2s.trace([1, 2], [1, 3]).names)
    unmasked = {
        n for n in s2s.hook_names if n.endswith(("encoder.0.attn.mask", "encoder.1.attn.mask", "cross_attn.mask"))
    }
    assert len(unmasked) == 2 + 3
    assert names == set(s2s.hook_names) - unmasked  # no source padding: only the decoder's causal mask exists
    assert set(s2s.trace([1, 2], [1, 3], source_mask=[1, 1]).names) == set(s2s.hook_names)
    cross = {n for n in names if n.startswith("decoder.2.cross_attn.")}
    assert cross == {f"decoder.2.cross_attn.{p}" for p in ("q", "k", "v", "scores", "scaled", "weights", "z", "out")}
    assert {"decoder.2.resid_after_cross", "decoder.2.ln_cross", "head.logits"} <= names


@pytest.mark.parametrize("name", list(TRACES))
def test_recomputed_scores_equal_the_ones_the_model_computed(name):
    full, model = TRACES[name]  # scores and scaled stored straight from the forward pass
    lean = RUNS[name][1](model, None)  # the default: scores and scaled recomputed from Q, K, scale, bias, mask
    derived = [n for n in lean.names if n.endswith((".scores", ".scaled"))]
    assert derived and not any(n in lean.activations for n in derived)
    for n in derived:
        assert n in full.activations
        np.testing.assert_array_equal(np.isneginf(lean[n]), np.isneginf(full[n]))
        finite = np.isfinite(full[n])
        np.testing.assert_allclose(lean[n][finite], full[n][finite], atol=1e-12)


def test_keep_filter_stores_only_chosen_names():
    trace = tiny_vit().trace(image(), keep=lambda n: n.endswith(".weights"))
    assert trace.names == ["encoder.0.attn.weights", "encoder.1.attn.weights"]
    assert trace.all_attention().shape == (2, 4, 14, 14)


@pytest.mark.parametrize(
    "build, run",
    [
        (
            tiny_encoder,
            lambda m: (m(torch.tensor([SRC]), torch.tensor([SRC_MASK])), m.trace(SRC, attention_mask=SRC_MASK)),
        ),
        (tiny_decoder, lambda m: (m(torch.tensor([TGT])), m.trace(TGT))),
        (tiny_seq2seq, lambda m: (m(torch.tensor([SRC]), torch.tensor([TGT])), m.trace(SRC, TGT))),
        (tiny_vit, lambda m: (m(image()[None]), m.trace(image()))),
    ],
)
def test_capture_changes_no_output_bit_for_bit_and_leaves_no_state(build, run):
    model = build()
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        plain_before = run(model)[0]
    _, trace = run(model)
    with torch.inference_mode():
        plain_after = run(model)[0]
    np.testing.assert_array_equal(trace.output, plain_before[0].numpy())  # bit for bit on CPU
    assert torch.equal(plain_before, plain_after)
    assert not capture_active()
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    for key, value in model.state_dict().items():
        assert torch.equal(value, state_before[key])


def test_capture_is_reset_when_the_forward_pass_fails():
    model = tiny_encoder()
    with pytest.raises(IndexError, match="index out of range"), torch.inference_mode(), tc.capture():
        assert capture_active()
        model(torch.tensor([[1, 2, 99]]))  # id 99 is outside the embedding table
    assert not capture_active()


def test_trace_arrays_are_read_only_numpy():
    trace, _ = TRACES["encoder-post"]
    w = trace.attention(0, 0)
    assert isinstance(w, np.ndarray) and not w.flags.writeable
    with pytest.raises(ValueError, match=r"^assignment destination is read-only$"):
        w[0, 0] = 1.0


def test_trace_accessors_and_bad_indices():
    trace, _ = TRACES["seq2seq-post"]
    assert trace.attention_stacks == ("encoder", "decoder", "cross")
    assert trace.stack_layers == {"encoder": 2, "decoder": 3} and trace.n_layers == 2 and trace.n_heads == 4
    assert trace.attention(2, 1, "cross").shape == (len(TGT), len(SRC))
    assert trace.tokens_for("cross") == (tuple(map(str, TGT)), tuple(map(str, SRC)))
    assert trace.all_attention("decoder").shape == (3, 4, len(TGT), len(TGT))
    with pytest.raises(tc.InputError, match=r"^layer 2 is out of range: the encoder stack has 2 layers \(0\.\.1\)$"):
        trace.attention(2, 0)
    with pytest.raises(tc.InputError, match=r"^head 4 is out of range: the model has 4 heads \(0\.\.3\)$"):
        trace.attention(0, 4)
    dec_trace, _ = TRACES["decoder"]
    with pytest.raises(tc.InputError, match=r"^this decoder trace has no 'cross' attention; it has \('decoder',\)$"):
        dec_trace.attention(0, 0, "cross")
    with pytest.raises(KeyError, match=r"'decoder\.9\.attn\.q' was not captured; see trace\.names"):
        dec_trace["decoder.9.attn.q"]


def test_batched_trace_gives_each_image_its_own_trace():
    model = tiny_vit()
    images = torch.stack([image(0), image(1), image(2)])
    batch = model.trace_batch(images)
    assert len(batch) == 3
    for i, trace in enumerate(batch):
        single = model.trace(images[i])
        assert trace.names == single.names
        np.testing.assert_allclose(trace.all_attention(), single.all_attention(), atol=1e-6)
        np.testing.assert_allclose(trace.output, single.output, atol=1e-5)
    assert not np.allclose(batch[0].attention(1), batch[1].attention(1))
    with pytest.raises(ValueError, match=r"^expected a batch of images \(B, C, H, W\), got shape \(3, 12, 16\)$"):
        model.trace_batch(images[0])


def test_a_generation_step_trace_says_it_holds_the_decoder_only():
    """The encoder ran once before the steps: a step trace holds the decoder and its cross-attention, and says so."""
    model = tiny_seq2seq()
    model.generation = tc.GenerationSettings(start_id=1, eos_id=2, max_new_tokens=3)
    step = model.generate([3, 7, 1], max_new_tokens=3).steps[0]
    assert step.stack_layers == {"decoder": 3} and step.attention_stacks == ("decoder", "cross")
    assert step.main_stack == "decoder" and not any(n.startswith("encoder.") for n in step.names)
    assert step.attention(2, 1, "cross").shape == (1, 3)  # the new position's row over the 3 source tokens
    with pytest.raises(
        tc.InputError, match=r"^this encoder-decoder trace has no 'encoder' attention; it has \('decoder', 'cross'\)$"
    ):
        step.attention(0, 0, stack="encoder")


def test_name_patterns_match_whole_parts():
    weights = matching("**.attn.weights")
    assert weights("encoder.3.attn.weights") and weights("decoder.0.attn.weights")
    assert not weights("decoder.0.cross_attn.weights") and not weights("encoder.3.attn.weights_x")
    head, decoder = matching("head.*"), matching("decoder.**")
    assert head("head.logits") and not head("head") and not head("decoder.head.logits")
    assert decoder("decoder.0.attn.q") and decoder("decoder") and not decoder("decoders.0")
    layer_q = matching("encoder.*.attn.q")
    assert layer_q("encoder.11.attn.q") and not layer_q("encoder.1.2.attn.q")
    assert any_of(head, layer_q)("head.logits") and not any_of(head, layer_q)("encoder.out")
    with pytest.raises(
        ValueError, match=r"^'encoder\.\*\*\.q': '\*\*' stands first or last, beside at least one other part$"
    ):
        matching("encoder.**.q")


def test_a_pattern_filter_captures_what_it_names():
    model = tiny_decoder()
    trace = model.trace([1, 2, 3], keep=matching("**.attn.weights", "head.logits"))
    assert sorted(trace.activations) == ["decoder.0.attn.weights", "decoder.1.attn.weights", "head.logits"]
