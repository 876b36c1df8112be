"""Llama-family checkpoints (Llama, Mistral, Qwen2, Qwen3) loaded into the core and compared with transformers'
eager forward and generate on the same weights (tiny random configs, no network); grouped-query attention in
the trace; rotary frequencies against transformers'; sampling; the key/value cache's step traces."""

import numpy as np
import pytest
import torch
import transformers as T
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import tformer_core as tc
from tests.core.hf_helpers import assert_close, perturbed, roundtrip
from tformer_core.checkpoints.hfconfig import HFConfig
from tformer_core.checkpoints.llama import rope_settings
from tformer_core.generation import next_token_probabilities, next_token_table
from tformer_core.models.positional import inverse_frequencies

IDS = [2, 17, 33, 8, 61, 5, 90, 3, 44, 12]  # longer than the sliding windows below
SIZES = dict(
    vocab_size=99, hidden_size=32, intermediate_size=48, max_position_embeddings=64, attn_implementation="eager"
)


def _hf(family):
    """A tiny random model of each family, each with what sets it apart."""
    if family == "llama":  # grouped-query (4 query heads, 2 K/V heads), Llama 3.1's rotary scaling, untied output
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        config = T.LlamaConfig(
            **SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=500.0,
            rope_scaling={**rope, "original_max_position_embeddings": 16},
        )
        return T.LlamaForCausalLM(config)
    if family == "mistral":  # one K/V head for all 4 query heads, a sliding window of 3 on every layer
        config = T.MistralConfig(
            **SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, sliding_window=3
        )
        return T.MistralForCausalLM(config)
    if family == "qwen2":  # biases on Q, K, V; a window of 4 on the layers from 1 on; tied output layer
        config = T.Qwen2Config(
            **SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            tie_word_embeddings=True,
        )
        return T.Qwen2ForCausalLM(config)
    # qwen3: an RMSNorm of each head's q and k, d_head 16 (4 x 16 != 32), YaRN scaling
    config = T.Qwen3Config(
        **SIZES,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    )
    return T.Qwen3ForCausalLM(config)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(transformers model, the core's model from its saved folder) per family."""
    made = {}
    for i, family in enumerate(FAMILIES):
        torch.manual_seed(i)
        hf = perturbed(_hf(family), seed=i, scale=0.3)  # sharper attention than the init's
        made[family] = (hf, roundtrip(hf, tmp_path_factory.mktemp(family)))
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_every_layers_attention_match_transformers(pairs, family):
    hf, model = pairs[family]
    assert isinstance(model, tc.Llama)
    trace = model.trace(IDS)
    with torch.no_grad():
        out = hf(torch.tensor([IDS]), output_attentions=True, output_hidden_states=True)
    assert_close(trace["decoder.out"], out.hidden_states[-1][0], what="final hidden states")
    assert_close(trace["head.logits"], out.logits[0], what="logits")
    for layer, weights in enumerate(out.attentions):
        assert_close(trace.attention(layer), weights[0], what=f"layer {layer} attention")
        assert np.all(np.triu(trace.attention(layer), 1) == 0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_matches_transformers(pairs, family, use_cache):
    hf, model = pairs[family]
    ours = model.generate(IDS[:4], max_new_tokens=9, use_cache=use_cache)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([IDS[:4]]), max_new_tokens=9, do_sample=False, num_beams=1, pad_token_id=0)
    # Both stop at the config's end token (or run the 9 new tokens): the same length and the same tokens.
    assert list(ours.ids) == theirs[0].tolist()
    assert len(ours.steps) == len(ours.generated_ids) == len(ours.probabilities)


def test_sliding_windows_are_applied_and_recorded_per_layer(pairs):
    model = pairs["qwen2"][1]  # layer 0 full causal, layers 1 and 2 a window of 4
    trace = model.trace(IDS)
    n = len(IDS)
    query, key = np.arange(n)[:, None], np.arange(n)[None, :]
    np.testing.assert_array_equal(trace["decoder.0.attn.mask"][0], key <= query)
    for layer in (1, 2):
        window = (key <= query) & (query - key < 4)
        np.testing.assert_array_equal(trace[f"decoder.{layer}.attn.mask"][0], window)
        assert np.all(trace.attention(layer)[~np.broadcast_to(window, (4, n, n))] == 0)
    mistral = pairs["mistral"][1].trace(IDS)
    assert mistral.attention(1)[0, 9, 6] == 0 and mistral.attention(1)[0, 9, 7] > 0  # window 3: 7, 8, 9


def test_gqa_keys_and_values_are_stored_per_kv_head(pairs):
    hf, model = pairs["llama"]  # 4 query heads, 2 key/value heads
    trace = model.trace(IDS)
    n, dh = len(IDS), 8
    assert trace.n_heads == 4 and trace.n_kv_heads == 2
    assert trace["decoder.0.attn.q"].shape == (4, n, dh)
    assert trace["decoder.0.attn.k"].shape == trace["decoder.0.attn.v"].shape == (2, n, dh)
    assert [trace.kv_head(h) for h in range(4)] == [0, 0, 1, 1]  # transformers' repeat_kv order
    assert trace.query_heads(1) == (2, 3)
    for head in range(4):
        np.testing.assert_array_equal(trace.k(1, head), trace["decoder.1.attn.k"][trace.kv_head(head)])
        np.testing.assert_array_equal(trace.v(1, head), trace["decoder.1.attn.v"][trace.kv_head(head)])
    assert trace.k(1).shape == (2, n, dh)  # every key/value head, as stored
    # K before the rotation is what transformers' k_proj computes, per key/value head.
    seen = {}
    hook = hf.model.layers[1].self_attn.k_proj.register_forward_hook(lambda m, i, o: seen.update(k=o))
    with torch.no_grad():
        hf(torch.tensor([IDS]))
    hook.remove()
    assert_close(trace["decoder.1.attn.k_pre_rope"], seen["k"][0].view(n, 2, dh).transpose(0, 1), what="K")


def test_qwen3_normalises_q_and_k_per_head_before_rotating(pairs):
    hf, model = pairs["qwen3"]
    trace = model.trace(IDS)
    seen = {}
    hook = hf.model.layers[0].self_attn.k_norm.register_forward_hook(lambda m, i, o: seen.update(k=o))
    with torch.no_grad():
        hf(torch.tensor([IDS]))
    hook.remove()
    assert_close(trace["decoder.0.attn.k_pre_rope"], seen["k"][0].transpose(0, 1), what="normalised K")


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_compact_traces_recompute_attention_under_gqa(pairs, family):
    model = pairs[family][1]
    full = model.trace(IDS, keep=lambda name: True)  # scores and the softmax input stored as computed
    compact = full.compact()
    assert "decoder.0.attn.weights" not in compact.activations
    for layer in range(model.config.n_layers):
        prefix = f"decoder.{layer}.attn"
        for part in ("scores", "scaled", "weights"):
            np.testing.assert_allclose(compact[f"{prefix}.{part}"], full[f"{prefix}.{part}"], atol=1e-5)
        np.testing.assert_allclose(compact.attention(layer, 3), full.attention(layer, 3), atol=1e-6)
        z = full.activations[f"{prefix}.z"]
        derived = full.attention(layer) @ np.repeat(full[f"{prefix}.v"], 4 // full.n_kv_heads, axis=0)
        np.testing.assert_allclose(derived, z, atol=1e-5)
        lean = model.trace(IDS, keep=lambda name: not name.endswith(".z"))
        np.testing.assert_allclose(lean[f"{prefix}.z"], z, atol=1e-5)
        np.testing.assert_allclose(lean.block("z", layer, 2), z[2], atol=1e-5)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 16.0,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "truncate": False,
        },
    ],
)
def test_rotary_frequencies_match_transformers(rope):
    config = T.LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=256, rope_theta=5e4)
    config.rope_parameters = {**rope, "rope_theta": 5e4}
    kind = rope["rope_type"]
    if kind == "default":
        theirs, factor = T.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        theirs, factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    ours = rope_settings(HFConfig({"rope_parameters": config.rope_parameters}), 256)
    if kind != "dynamic":  # dynamic changes nothing within the maximum length, which the core never passes
        np.testing.assert_allclose(inverse_frequencies(32, ours).numpy(), theirs.numpy(), rtol=1e-6)
    assert tc.rope_attention_factor(ours) == pytest.approx(factor)
    np.testing.assert_allclose(tc.rope_frequencies(32, ours), theirs.double().numpy(), rtol=1e-6)


def test_the_model_rotates_q_and_k_as_rope_rotate_says(pairs):
    for family in ("llama", "qwen3"):  # Llama 3.1 scaling, YaRN (cos and sin scaled too)
        model = pairs[family][1]
        trace = model.trace(IDS)
        freqs, factor = model.rope_frequencies(), model.rope_attention_factor
        positions = np.arange(len(IDS))
        for name in ("q", "k"):
            before = trace[f"decoder.1.attn.{name}_pre_rope"]  # [heads, n, d_head]
            np.testing.assert_allclose(
                tc.rope_rotate(before, positions, freqs, factor), trace[f"decoder.1.attn.{name}"], atol=1e-5
            )


def test_rotated_dot_products_depend_on_the_offset_only():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=64), rng.normal(size=64)
    freqs = tc.rope_frequencies(64, tc.Rope(theta=1e4))
    assert freqs[0] == 1.0 and freqs[-1] == pytest.approx(1e4 ** (-62 / 64))
    for offset in (0, 3, -5):
        products = [tc.rope_rotate(q, m, freqs) @ tc.rope_rotate(k, m + offset, freqs) for m in (0, 7, 100, 4000)]
        np.testing.assert_allclose(products, products[0], rtol=1e-9, atol=1e-9)
    assert not np.isclose(tc.rope_rotate(q, 0, freqs) @ tc.rope_rotate(k, 3, freqs), q @ k)
    np.testing.assert_allclose(np.linalg.norm(tc.rope_rotate(q, 123, freqs)), np.linalg.norm(q))  # a rotation
    np.testing.assert_array_equal(tc.rope_rotate(q, 0, freqs), q)
    with pytest.raises(ValueError, match=r"^x has 10 dimensions; 32 frequencies rotate 64$"):
        tc.rope_rotate(q[:10], 1, freqs)


def test_cached_steps_hold_the_new_tokens_attention_row(pairs):
    model = pairs["mistral"][1]  # with a sliding window of 3: the step's row sees its last 3 positions
    gen = model.generate(IDS[:4], max_new_tokens=8)
    prompt = gen.steps[0]
    assert prompt.attention(0).shape == (4, 4, 4) and prompt.meta["query_start"] == 0
    assert next_token_table(prompt, 3)[0].shape == (4, 3)  # the prompt's own trace: top-k after every position
    for t, step in enumerate(gen.steps[1:], start=1):
        n = 4 + t
        assert step.attention(1).shape == (4, 1, n)
        assert step["decoder.1.attn.k"].shape == (1, n, 8)  # K of every position so far, one key/value head
        assert step.meta["query_start"] == n - 1 and step.tokens_for() == (step.tokens[-1:], step.tokens)
        np.testing.assert_allclose(step.attention(1, 2)[-1], gen.trace.attention(1, 2)[n - 1, :n], atol=1e-5)
        assert np.all(step.attention(1)[:, 0, : n - 3] == 0)
        assert [label for label, _ in step.predictions(k=1)] == [str(gen.ids[n])]
        np.testing.assert_allclose(step.compact().attention(1), step.attention(1), atol=1e-6)


def test_sampling_is_reproducible_with_a_seed(pairs):
    model = pairs["llama"][1]
    hot = tc.Sampling(temperature=1.5, seed=7)
    a, b = model.generate(IDS[:3], 12, sampling=hot), model.generate(IDS[:3], 12, sampling=hot)
    assert a.ids == b.ids and a.probabilities == b.probabilities and a.sampling == hot
    others = {model.generate(IDS[:3], 12, sampling=tc.Sampling(temperature=1.5, seed=s)).ids for s in range(6)}
    assert len(others) > 1  # the seed matters
    greedy = model.generate(IDS[:3], 12)
    assert model.generate(IDS[:3], 12, sampling=tc.Sampling(temperature=0)).ids == greedy.ids
    assert model.generate(IDS[:3], 12, sampling=tc.Sampling(top_k=1, seed=3)).ids == greedy.ids
    for t, step in enumerate(a.steps):  # each drawn token had a place in the distribution it was drawn from
        p = next_token_probabilities(torch.from_numpy(np.array(step["head.logits"][-1:])), hot)[0]
        assert p[a.generated_ids[t]] == pytest.approx(a.probabilities[t]) and a.probabilities[t] > 0


def test_next_token_probabilities_follow_temperature_and_top_k():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]])
    plain = next_token_probabilities(logits)
    np.testing.assert_allclose(plain.numpy(), torch.softmax(logits, -1).numpy())
    cold = next_token_probabilities(logits, tc.Sampling(temperature=0.5))
    np.testing.assert_allclose(cold.numpy(), torch.softmax(logits * 2, -1).numpy(), rtol=1e-6)
    top = next_token_probabilities(logits, tc.Sampling(top_k=2))[0]
    assert top[3] == top[4] == 0 and top[1] == top[2] > 0  # the tie with the 2nd is kept, as transformers keeps it
    assert float(top.sum()) == pytest.approx(1.0)
    for bad, message in (
        ({"temperature": -1}, r"^temperature must be a number >= 0 \(0 = greedy\), got -1$"),
        ({"temperature": float("nan")}, r"^temperature must be a number >= 0 \(0 = greedy\), got nan$"),
        ({"top_k": 0}, r"^top_k must be a whole number >= 1 or None \(every token\), got 0$"),
        ({"top_k": 2.5}, r"^top_k must be a whole number >= 1 or None \(every token\), got 2\.5$"),
    ):
        with pytest.raises(tc.InputError, match=message):
            tc.Sampling(**bad)


def test_next_token_table_ranks_every_position(pairs):
    hf, model = pairs["qwen2"]
    trace = model.trace(IDS)
    ids, probs = next_token_table(trace, 4)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([IDS])).logits[0], -1)
    assert ids.shape == probs.shape == (len(IDS), 4)
    np.testing.assert_allclose(probs, torch.topk(p, 4).values.numpy(), atol=1e-5)
    for position in (0, 5, -1):
        assert [int(label) for label, _ in trace.predictions(4, position)] == list(ids[position])
    compact_ids, compact_probs = next_token_table(trace.compact(), 4)
    np.testing.assert_array_equal(compact_ids, ids)
    np.testing.assert_allclose(compact_probs, probs, atol=1e-6)


def test_llama_configs_are_checked():
    base = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "vocab_size": 99,
    }
    from tformer_core.checkpoints.errors import CheckpointError
    from tformer_core.checkpoints.llama import llama_config

    def config(**changes):
        return llama_config(HFConfig({**base, **changes}), changes.get("model_type", "llama"))

    assert config().n_kv_heads is None and config(num_key_value_heads=2).n_kv_heads == 2
    with pytest.raises(CheckpointError, match=r"num_key_value_heads \(3\) must divide num_attention_heads \(4\)"):
        config(num_key_value_heads=3)
    with pytest.raises(
        CheckpointError, match=r"rope_type 'longrope' is not supported yet \(default, linear, dynamic, llama3, yarn\)$"
    ):
        config(rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(
        CheckpointError, match=r"partial_rotary_factor below 1 \(rotating part of each head\) is not supported yet$"
    ):
        config(partial_rotary_factor=0.5)
    with pytest.raises(
        CheckpointError, match=r"layer_types must list 2 of \('full_attention', 'sliding_attention'\), one per layer$"
    ):
        config(model_type="qwen2", layer_types=["full_attention"])
    assert config(
        model_type="qwen2", layer_types=["sliding_attention", "full_attention"], sliding_window=5
    ).sliding_layers == (0,)
    assert config(model_type="mistral", sliding_window=7).windowed(1)
    old = config(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}).rope  # transformers 4's keys
    assert (old.theta, old.type, old.factor) == (5e5, "linear", 2.0)
