"""The model kinds: every family is one of the four, declares what it can do, and nothing is probed."""

import pytest
import torch

import tformer_core as tc
from tests.core.hf_helpers import save_with_words, tiny_opt, tiny_pegasus
from tests.core.tiny_models import tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.checkpoints.fallback import load_transformers


def tiny_llama():
    torch.manual_seed(0)
    return tc.Llama(tc.LlamaConfig(vocab_size=40, max_positions=32, n_layers=2, d_model=16, n_heads=4, n_kv_heads=2))


@pytest.mark.parametrize(
    ("build", "kind", "family"),
    [
        (tiny_encoder, tc.EncoderModel, "encoder"),
        (tiny_decoder, tc.CausalLM, "decoder"),
        (tiny_llama, tc.CausalLM, "decoder"),
        (tiny_seq2seq, tc.EncoderDecoderModel, "encoder-decoder"),
        (tiny_vit, tc.VisionModel, "vit"),
    ],
)
def test_every_family_is_one_kind_and_says_so(build, kind, family):
    model = build()
    assert isinstance(model, kind) and model.kind == family
    others = {tc.EncoderModel, tc.CausalLM, tc.EncoderDecoderModel, tc.VisionModel} - {kind}
    assert not any(isinstance(model, other) for other in others)
    assert model.capabilities.qkv and model.capabilities.weights and model.weights_note == ""


def test_capabilities_are_declared_per_family():
    assert tiny_decoder().capabilities == tc.Capabilities(
        head="next-token", generates=True, sampling=True, kv_cache=True, chat_template=False
    )
    assert tiny_seq2seq().capabilities == tc.Capabilities(head="next-token", generates=True)
    assert tiny_encoder().capabilities == tc.Capabilities(head=None)
    assert tiny_vit().capabilities == tc.Capabilities(head="classification")
    mlm = tc.Encoder(tc.EncoderConfig(vocab_size=30, mlm_head=True))
    assert mlm.capabilities.head == "masked-word" and not mlm.capabilities.generates


def test_a_kind_cannot_be_built_without_its_trace():
    with pytest.raises(
        TypeError, match=r"^Can't instantiate abstract class CausalLM with.* abstract methods '?generate'?, '?trace'?$"
    ):
        tc.CausalLM(tc.DecoderConfig())  # type: ignore[abstract]


def test_models_transformers_runs_declare_what_they_lack_and_refuse_sampling(tmp_path):
    decoder = load_transformers(save_with_words(tiny_opt(), tmp_path / "opt"))
    assert isinstance(decoder, tc.CausalLM) and isinstance(decoder, tc.TransformersModel)
    caps = decoder.capabilities
    assert (caps.qkv, caps.weights, caps.sampling, caps.kv_cache) == (False, False, False, False)
    assert caps.generates and caps.head == "next-token"
    with pytest.raises(
        tc.InputError, match=r"^this model runs through transformers' own code, which tformer decodes greedily only$"
    ):
        decoder.generate("the cat", 2, sampling=tc.Sampling(0.8, None, 0))
    greedy = decoder.generate("the cat", 2, sampling=tc.Sampling(0.0))
    assert greedy.ids == decoder.generate("the cat", 2).ids
    seq2seq = load_transformers(save_with_words(tiny_pegasus(), tmp_path / "pegasus"))
    assert isinstance(seq2seq, tc.EncoderDecoderModel) and not seq2seq.capabilities.qkv


def test_a_chat_template_comes_from_the_tokenizer_for_every_causal_lm(tmp_path):
    decoder = load_transformers(save_with_words(tiny_opt(), tmp_path / "opt"))
    assert decoder.chat_template is None and not decoder.capabilities.chat_template
    with pytest.raises(
        tc.InputError, match=r"^this model's tokenizer has no chat template: give the prompt as plain text$"
    ):
        decoder.chat_prompt([{"role": "user", "content": "hi"}])
    decoder.tokenizer.hf.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<bot>"
    assert decoder.capabilities.chat_template
    assert decoder.chat_prompt([{"role": "user", "content": "the cat"}]) == "<user>the cat<bot>"


def test_a_traces_meta_is_typed_and_still_reads_like_the_old_dict():
    model = tiny_llama()
    step = model.generate([1, 2, 3], 2).steps[1]
    meta = step.meta
    assert isinstance(meta, tc.TraceMeta) and meta.query_start == 3 and meta.n_kv_heads == 2
    assert meta.path == "tformer" and meta.predict_position == -1 and meta.attention_scale == 0.5
    assert meta["query_start"] == 3 and meta.get("absent", "none") == "none" and "labels" in meta
    with pytest.raises(KeyError, match=r"^'colour'$"):
        meta["colour"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        tc.TraceMeta.of({"colour": "red"})  # a key no field names is refused, not carried along
    trace = tc.Trace("encoder", {}, ("a",), 2, {"encoder": 1}, meta={"head": "masked-word"})
    assert trace.meta == tc.TraceMeta(head="masked-word") and trace.meta.probabilities == "softmax"
