"""Encoder-decoder checkpoints (Marian, BART, T5 original and v1.1) load into tc.EncoderDecoder with
transformers' own numbers: logits, every attention map of every stack, greedy generation.

Tiny random models are built from configs with transformers, saved in the Hugging Face layout and
loaded through `tc.load_model`; the reference is transformers' eager implementation of the same
folder (`from_pretrained`, so tying rules are transformers' own). No network.
"""

import json
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import tformer_core as tc  # noqa: E402
from tformer_core.checkpoints import CheckpointError, bart, marian, t5  # noqa: E402

TOL = 1e-4
V = 60
SRC_LEN, PAD_LEN, TGT_LEN = 11, 4, 7  # element 1 of the batch ends with PAD_LEN padding tokens
NEW_TOKENS = 8


def _randomize_norms_and_bias(model, seed):
    """LayerNorm / RMSNorm weights and biases and final_logits_bias away from 1 / 0, so nothing passes by identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                mean = 1.0 if name.endswith("weight") else 0.0
                p.copy_(mean + 0.2 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))


def _sharpen(model, seed, learned_positions):
    """transformers' init (std 0.02) leaves tiny BART / Marian models with near-uniform attention, where a wrong
    scale or position would hardly show: weights of std 1.5 / sqrt(fan_in) make the attention maps peaked."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("_proj.weight", "fc1.weight", "fc2.weight")):
                p.copy_(1.5 / math.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
            elif name.endswith(("_proj.bias", "fc1.bias", "fc2.bias")):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(("shared.weight", "embed_tokens.weight")) or (
                learned_positions and name.endswith("embed_positions.weight")  # Marian's sinusoids stay
            ):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def _marian():
    pad = V - 1
    cfg = transformers.MarianConfig(
        vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        scale_embedding=True,
        activation_function="swish",
    )
    model = transformers.MarianMTModel(cfg)
    _sharpen(model, 11, learned_positions=False)
    _randomize_norms_and_bias(model, 1)
    with torch.no_grad():
        model.final_logits_bias[0, pad] = 50.0  # the padding token would win every step unless suppressed
    model.generation_config.bad_words_ids = [[pad]]
    # opus-mt checkpoints carry their generation rules in config.json too (written before generation_config.json)
    legacy = {
        "bad_words_ids": [[pad]],
        "normalize_before": False,
        "normalize_embedding": False,
        "static_position_embeddings": True,
        "add_bias_logits": False,
    }
    return model, legacy, {"pad": pad, "special": {0, pad}}


def _bart():
    cfg = transformers.BartConfig(
        vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
        activation_function="gelu",
    )
    model = transformers.BartForConditionalGeneration(cfg)
    _sharpen(model, 12, learned_positions=True)
    _randomize_norms_and_bias(model, 2)
    model.generation_config.forced_bos_token_id = 0  # as facebook/bart-large-cnn
    legacy = {
        "forced_bos_token_id": 0,
        "normalize_before": False,
        "add_final_layer_norm": False,
        "normalize_embedding": True,
    }
    return model, legacy, {"pad": 1, "special": {0, 1, 2}}


def _t5(gated):
    cfg = transformers.T5Config(
        vocab_size=V,
        d_model=32,
        d_kv=6,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=not gated,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(cfg)
    _randomize_norms_and_bias(model, 3)
    if gated:  # v1.1: a separate lm_head (transformers 5 ties at construction; the checkpoint decides)
        with torch.no_grad():
            model.lm_head.weight = torch.nn.Parameter(torch.randn(V, 32, generator=torch.Generator().manual_seed(4)))
    return model, {}, {"pad": 0, "special": {0, 1}}


FAMILIES = {"marian": _marian, "bart": _bart, "t5": lambda: _t5(False), "t5-v1.1": lambda: _t5(True)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(name, ours, reference, info, folder) for one family."""
    name = request.param
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the untied T5 lm_head is reported as a warning
    try:
        torch.manual_seed(0)
        model, legacy, info = FAMILIES[name]()
        root = tmp_path_factory.mktemp(name.replace(".", ""))
        folder = root / "m"
        model.save_pretrained(folder)
        if legacy:
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, **legacy}))
        reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    finally:
        transformers.logging.set_verbosity(verbosity)
    ours = tc.load_model(str(folder), device="cpu", model_dirs=[root])
    return name, ours, reference, info, folder


def _inputs(info, seed=5):
    g = torch.Generator().manual_seed(seed)
    ordinary = [i for i in range(V) if i not in info["special"]]
    pick = lambda n: torch.tensor(ordinary)[torch.randint(len(ordinary), (n,), generator=g)]  # noqa: E731
    src = torch.stack([pick(SRC_LEN), pick(SRC_LEN)])
    mask = torch.ones(2, SRC_LEN, dtype=torch.long)
    mask[1, -PAD_LEN:] = 0
    src[1, -PAD_LEN:] = info["pad"]
    return src, mask, torch.stack([pick(TGT_LEN), pick(TGT_LEN)])


def _reference(reference, src, mask, tgt):
    with torch.no_grad():
        return reference(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)


def _target(ours, tgt):
    return torch.cat([torch.full((tgt.shape[0], 1), ours.generation.start_id), tgt[:, :-1]], dim=1)


def test_logits_and_every_attention_map_match_transformers(pair):
    name, ours, reference, info, _ = pair
    src, mask, tgt = _inputs(info)
    tgt = _target(ours, tgt)  # the decoder's input starts with its start token
    out = _reference(reference, src, mask, tgt)
    with torch.inference_mode():
        logits = ours(src, tgt, mask)
    torch.testing.assert_close(logits, out.logits, atol=TOL, rtol=0)
    stacks = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    for b in range(2):  # element 1 has a padded source: its padding keys get weight 0
        trace = ours.trace(src[b].tolist(), tgt[b].tolist(), source_mask=mask[b].tolist())
        np.testing.assert_allclose(trace.output, out.logits[b].numpy(), atol=TOL, rtol=0)
        for stack, theirs in stacks.items():
            assert trace.layers_in(stack) == len(theirs)
            for layer, weights in enumerate(theirs):
                ours_weights, message = trace.attention(layer, None, stack), f"{name} {stack} layer {layer}"
                np.testing.assert_allclose(ours_weights, weights[b].numpy(), atol=TOL, rtol=0, err_msg=message)
        if b == 1:
            assert np.all(trace.attention(0, None, "encoder")[..., -PAD_LEN:] == 0)
            assert np.all(trace.attention(0, None, "cross")[..., -PAD_LEN:] == 0)


def test_captured_queries_keys_and_bias_reproduce_the_weights(pair):
    """Marian / BART: softmax(Q K^T / sqrt(d_k)); T5: softmax(Q K^T + relative bias), no scaling."""
    name, ours, reference, info, _ = pair
    src, mask, tgt = _inputs(info)
    tgt = _target(ours, tgt)
    trace = ours.trace(src[1].tolist(), tgt[1].tolist(), source_mask=mask[1].tolist())
    is_t5 = name.startswith("t5")
    allowed = {
        "encoder": np.broadcast_to(mask[1].numpy().astype(bool), (SRC_LEN, SRC_LEN)),
        "decoder": np.tril(np.ones((TGT_LEN, TGT_LEN), dtype=bool)),
        "cross": np.broadcast_to(mask[1].numpy().astype(bool), (TGT_LEN, SRC_LEN)),
    }
    for stack in ("encoder", "decoder", "cross"):
        bias = trace[f"{stack}.position_bias"] if is_t5 and stack != "cross" else 0.0  # cross-attention: none
        for layer in range(trace.layers_in(stack)):
            q = trace.block("q", layer, None, stack).astype(np.float64)
            k = trace.block("k", layer, None, stack).astype(np.float64)
            logits = q @ k.transpose(0, 2, 1) * (1.0 if is_t5 else 1.0 / math.sqrt(q.shape[-1])) + bias
            logits = np.where(allowed[stack], logits, -np.inf)
            expected = np.exp(logits - logits.max(-1, keepdims=True))
            expected /= expected.sum(-1, keepdims=True)
            np.testing.assert_allclose(trace.attention(layer, None, stack), expected, atol=1e-5, rtol=0)
    if is_t5:  # the captured bias is transformers' relative position bias (block 0 computes it for the stack)
        for stack, n in (("encoder", SRC_LEN), ("decoder", TGT_LEN)):
            theirs = getattr(reference, stack).block[0].layer[0].SelfAttention.compute_bias(n, n)[0]
            np.testing.assert_allclose(trace[f"{stack}.position_bias"], theirs.detach().numpy(), atol=1e-6, rtol=0)


def test_greedy_generation_matches_transformers(pair):
    name, ours, reference, info, _ = pair
    src, _, _ = _inputs(info, seed=7)
    # transformers 5.23 sizes T5's decoder cache by num_layers (2), not num_decoder_layers (3): no cache there
    cache = {"use_cache": False} if name.startswith("t5") else {}
    for b in range(2):
        source = src[b]
        with torch.no_grad():
            theirs = reference.generate(source[None], max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1, **cache)
        theirs = theirs[0].tolist()
        assert list(ours.generate(source.tolist(), max_new_tokens=NEW_TOKENS).ids) == theirs, name
    if name == "marian":  # the bias makes the padding token the favourite: only suppression keeps it out
        assert info["pad"] not in ours.generate(src[0].tolist(), max_new_tokens=NEW_TOKENS).ids[1:]


def test_structure_and_generation_settings(pair):
    name, ours, _, info, folder = pair
    c, g = ours.config, ours.generation
    family = {"marian": marian, "bart": bart, "t5": t5, "t5-v1.1": t5}[name]
    if name == "marian":
        assert (c.positional, c.pe_layout, c.embed_scale, c.embed_norm) == ("sinusoidal", "split", True, False)
        assert c.activation == "silu"
        assert (g.start_id, g.eos_id, g.suppress_ids, g.forced_eos) == (info["pad"], 0, (info["pad"],), True)
    elif name == "bart":
        assert (c.positional, c.position_first_row, c.embed_norm, c.activation) == ("learned", 2, True, "gelu")
        assert (g.start_id, g.eos_id, g.forced_bos_id, g.forced_eos, g.suppress_ids) == (2, 2, 0, True, ())
    else:
        gated = name == "t5-v1.1"
        assert (c.norm, c.norm_type, c.scale_attention, c.bias) == ("pre", "rmsnorm", False, False)
        assert c.positional == "none"
        assert (c.ffn_gated, c.activation) == ((True, "gelu_tanh") if gated else (False, "relu"))
        assert (c.n_encoder_layers, c.n_decoder_layers, c.head_dim) == (2, 3, 6)
        tied = ours.head.unembed.weight is ours.decoder.embed.tok.weight
        assert tied is not gated
        assert c.output_scale == (1.0 if gated else 32**-0.5)
        assert (g.start_id, g.eos_id, g.forced_eos) == (0, 1, False)
    if name in ("marian", "bart", "t5"):
        assert ours.head.unembed.weight is ours.decoder.embed.tok.weight
    # generation_config.json (transformers 5 writes the rules only there) gives the same settings
    hf = json.loads((folder / "config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    bare = {k: v for k, v in hf.items() if k not in ("bad_words_ids", "forced_bos_token_id")}
    assert family.generation_rules(bare, generation) == g


@pytest.mark.parametrize(
    "family, hf, message",
    [
        (bart, {"model_type": "bart", "normalize_before": True}, "BART with normalize_before=true"),
        (
            bart,
            {"model_type": "bart", "encoder_attention_heads": 4, "decoder_attention_heads": 8},
            "BART with encoder_attention_heads=4 but decoder_attention_heads=8",
        ),
        (
            marian,
            {"model_type": "marian", "encoder_ffn_dim": 64, "decoder_ffn_dim": 32},
            "Marian with encoder_ffn_dim=64 but decoder_ffn_dim=32",
        ),
        (marian, {"model_type": "marian", "normalize_embedding": True}, "Marian with normalize_embedding=true"),
        (t5, {"model_type": "t5", "feed_forward_proj": "gated-gelu-x"}, "T5 feed_forward_proj 'gated-gelu-x'"),
    ],
)
def test_variants_the_core_cannot_express_are_refused(family, hf, message):
    with pytest.raises(CheckpointError, match=f"^not supported yet: {message}"):
        family.build(hf, {})


def test_rules_kept_only_in_generation_config_are_read(tmp_path):
    model, _, info = _marian()
    folder = tmp_path / "marian"
    model.save_pretrained(folder)
    assert "bad_words_ids" not in json.loads((folder / "config.json").read_text())  # transformers 5 moved it
    assert json.loads((folder / "generation_config.json").read_text())["bad_words_ids"] == [[info["pad"]]]
    ours = tc.load_model(str(folder), device="cpu", model_dirs=[tmp_path])
    assert info["pad"] in ours.generation.suppress_ids
