"""Architectures the core does not implement, run by transformers (eager attention) and traced from what it hands
out: tiny random checkpoints of ELECTRA, ALBERT, OPT and Pegasus, saved here and loaded back (no network). The
traces' weights and hidden states must equal transformers' own outputs on the same input."""

import json
import pickle

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import EAGER, VOCAB, assert_close, perturbed, save_with_words, tiny_opt, tiny_pegasus
from tformer_core.checkpoints.fallback import TRACE_MAX_TOKENS, handles, load_transformers, transformers_implements
from tformer_core.models.encoder import class_scores
from tformer_core.models.fallback import TransformersDecoder, TransformersEncoder, TransformersSeq2Seq

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
_save = save_with_words


def _electra(head="mlm", **extra):
    config = T.ElectraConfig(vocab_size=len(VOCAB), embedding_size=16, **SMALL, **EAGER, **extra)
    cls = {
        "mlm": T.ElectraForMaskedLM,
        "classifier": T.ElectraForSequenceClassification,
        "qa": T.ElectraForQuestionAnswering,
    }
    torch.manual_seed(0)
    return perturbed(cls[head](config), scale=0.2)


def _theirs(hf, ids, **kwargs):
    with torch.no_grad():
        return hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True, **kwargs)


def _same_stack(trace, stack, attentions, hidden):
    assert len(attentions) == trace.layers_in(stack) == 2 and len(hidden) == 3
    for layer, weights in enumerate(attentions):
        ours = trace.attention(layer, stack=stack)
        assert_close(ours, weights[0], what=f"{stack} layer {layer} attention")
        np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-5)
        assert_close(trace[f"{stack}.{layer}.resid_pre"], hidden[layer][0], what=f"{stack} layer {layer} input")
    assert_close(trace[f"{stack}.out"], hidden[-1][0], what=f"{stack} final hidden states")


def test_an_encoder_transformers_runs_is_traced_like_the_core_models(tmp_path):
    hf = _electra()
    model = load_transformers(_save(hf, tmp_path / "electra"))
    assert isinstance(model, TransformersEncoder) and model.kind == "encoder" and model.path == "transformers"
    assert model.config.head == "masked-word" and model.output_vocab_size == len(VOCAB)
    assert model.max_tokens == 512 and model.config.n_layers == 2 and model.config.n_heads == 4
    text = "the cat [MASK] on the mat"
    trace = model.trace(text)
    ids = model.tokenizer.encode(text)
    assert trace.tokens == ("[CLS]", "the", "cat", "[MASK]", "on", "the", "mat", "[SEP]")
    out = _theirs(hf, ids)
    _same_stack(trace, "encoder", out.attentions, out.hidden_states)
    assert_close(trace["head.logits"], out.logits[0], what="masked-word logits")
    p = torch.softmax(out.logits[0, 3], -1).numpy()
    top = trace.predictions(k=3)
    assert [label for label, _ in top] == [VOCAB[i] for i in np.argsort(-p)[:3]]
    np.testing.assert_allclose([q for _, q in top], np.sort(p)[::-1][:3], atol=1e-5)
    # What the trace cannot hold, and says so: Q, K, V were never handed out.
    assert trace.meta["path"] == "transformers" and trace.meta["architecture"] == "ElectraForMaskedLM"
    assert "queries, keys and values" in trace.meta["absent"] and "attn.q" in trace.meta["absent_parts"]
    assert "encoder.0.attn.q" not in trace and "encoder.0.attn.scores" not in trace
    with pytest.raises(KeyError, match=r"'encoder\.0\.attn\.q' was not captured"):
        trace.q(0, 0)
    # The app's filters (no [heads, n, n] parts) and a compact trace keep the weights: nothing recomputes them.
    lean = model.trace(text, keep=lambda name: name.endswith(".attn.q"))
    assert lean.names == ["encoder.0.attn.weights", "encoder.1.attn.weights"]
    assert_close(trace.compact().attention(1), out.attentions[1][0], what="compact trace")


def test_a_base_model_with_segments_and_padding(tmp_path):
    torch.manual_seed(1)
    hf = perturbed(T.AlbertModel(T.AlbertConfig(vocab_size=len(VOCAB), embedding_size=16, **SMALL, **EAGER)), scale=0.2)
    model = load_transformers(_save(hf, tmp_path / "albert"))
    assert model.kind == "encoder" and model.config.head is None and model.output_vocab_size == 0
    trace = model.trace("the cat sat", pair="a dog ran")
    ids, types = model.tokenizer.encode_pair("the cat sat", "a dog ran")
    assert types == [0] * 5 + [1] * 4
    out = _theirs(hf, ids, token_type_ids=torch.tensor([types]))
    _same_stack(trace, "encoder", out.attentions, out.hidden_states)
    assert not trace.has_head and "encoder.0.attn.mask" not in trace
    padded = model.trace(ids, attention_mask=[1] * 7 + [0, 0])
    assert padded["encoder.0.attn.mask"].shape == (1, 9, 9)
    assert not padded["encoder.0.attn.mask"][0, :, 7:].any()
    np.testing.assert_allclose(padded.attention(0)[:, :, 7:], 0.0, atol=1e-6)


_opt = tiny_opt


def test_a_decoder_is_recognised_by_its_causal_attention_and_generates_as_transformers(tmp_path):
    hf = _opt()
    model = load_transformers(_save(hf, tmp_path / "opt", tokenizer=False))
    assert isinstance(model, TransformersDecoder) and model.kind == "decoder" and model.config.causal
    ids = [2, 9, 6, 7, 12, 5]
    trace = model.trace(ids)
    out = _theirs(hf, ids)
    _same_stack(trace, "decoder", out.attentions, out.hidden_states)
    assert_close(trace["head.logits"], out.logits[0], what="next-token logits")
    for layer in range(2):
        assert np.all(np.triu(trace.attention(layer), 1) == 0)
        assert np.array_equal(trace[f"decoder.{layer}.attn.mask"][0], np.tril(np.ones((6, 6), dtype=bool)))
    gen = model.generate(ids[:3], max_new_tokens=6)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids[:3]]), max_new_tokens=6, do_sample=False, num_beams=1)
    assert list(gen.ids) == theirs[0].tolist()  # the same length (stopped at the same step) and the same tokens
    assert len(gen.steps) == len(gen.generated_ids) and gen.steps[0].attention(1).shape == (4, 3, 3)


def test_an_encoder_decoder_traces_its_three_attentions_and_translates_as_transformers(tmp_path):
    hf = tiny_pegasus()
    model = load_transformers(_save(hf, tmp_path / "pegasus", tokenizer=False))
    assert isinstance(model, TransformersSeq2Seq) and model.kind == "encoder-decoder"
    source, target = [5, 9, 6, 7, 3], [0, 12, 8]
    trace = model.trace(source, target)
    with torch.no_grad():
        out = hf(
            torch.tensor([source]),
            decoder_input_ids=torch.tensor([target]),
            output_attentions=True,
            output_hidden_states=True,
        )
    _same_stack(trace, "encoder", out.encoder_attentions, out.encoder_hidden_states)
    _same_stack(trace, "decoder", out.decoder_attentions, out.decoder_hidden_states)
    for layer, weights in enumerate(out.cross_attentions):
        assert_close(trace.attention(layer, stack="cross"), weights[0], what=f"cross-attention {layer}")
    assert trace.attention(0, stack="cross").shape == (4, 3, 5)
    assert_close(trace["head.logits"], out.logits[0], what="logits")
    gen = model.generate(source, max_new_tokens=5)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([source]), max_new_tokens=5, do_sample=False, num_beams=1)
    assert list(gen.ids) == theirs[0].tolist()
    assert gen.steps[-1].stack_layers == {"decoder": 2}


def test_a_sequence_classifier_transformers_runs_shows_its_labels(tmp_path):
    hf = _electra("classifier", id2label={0: "sad", 1: "happy"}, label2id={"sad": 0, "happy": 1})
    model = load_transformers(_save(hf, tmp_path / "sentiment"))
    assert model.output_labels == ("sad", "happy") and model.output_vocab_size == 0
    trace = model.trace("the dog is big")
    out = _theirs(hf, model.tokenizer.encode("the dog is big"))
    assert_close(trace["head.logits"], out.logits[0], what="classifier logits")
    p = torch.softmax(out.logits[0], -1).numpy()
    assert [label for label, _ in class_scores(trace)] == [("sad", "happy")[i] for i in np.argsort(-p)]
    assert trace.meta["head"] == "classification" and trace.meta["probabilities"] == "softmax"


def test_a_head_the_core_does_not_show_is_left_out_and_named(tmp_path):
    hf = _electra("qa")
    model = load_transformers(_save(hf, tmp_path / "qa"))
    assert model.config.head is None and model.config.architecture == "ElectraModel"
    trace = model.trace("the cat sat")
    assert trace.meta["dropped_head"] == "ElectraForQuestionAnswering" and not trace.has_head
    out = _theirs(hf.electra, model.tokenizer.encode("the cat sat"))
    _same_stack(trace, "encoder", out.attentions, out.hidden_states)


def _custom(folder, config):
    """A folder whose config points at its own code, which writes a file if it is ever imported."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for module in ("modeling_custom", "configuration_custom"):
        (folder / f"{module}.py").write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\n")
    return folder


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {
                "model_type": "my-own-net",
                "architectures": ["MyNet"],
                "auto_map": {"AutoModel": "modeling_custom.MyNet"},
            },
            "custom model",
        ),
        (
            {
                "model_type": "electra",
                "architectures": ["ElectraWithTwist"],
                "auto_map": {"AutoModel": "modeling_custom.X"},
            },
            "architecture ElectraWithTwist",
        ),
    ],
)
def test_a_checkpoints_own_code_is_never_run(tmp_path, config, message):
    folder = _custom(tmp_path / "custom", {**config, "vocab_size": 30, **SMALL})
    with pytest.raises(tc.CheckpointError, match=message) as error:
        load_transformers(folder)
    assert "not part of transformers" in str(error.value) and "never runs" in str(error.value)
    assert not (folder / "RAN").exists()


def test_unknown_and_non_text_architectures_are_refused_with_a_reason(tmp_path):
    assert transformers_implements("electra") and not transformers_implements("surely-not-a-model")
    assert handles({"model_type": "electra"}) and handles({"model_type": "x", "auto_map": {"AutoModel": "m.X"}})
    assert not handles({"model_type": "surely-not-a-model"}) and not handles({"model_type": ["electra"]})
    folder = tmp_path / "unknown"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "surely-not-a-model"}')
    with pytest.raises(tc.CheckpointError, match="neither one of tformer's architectures nor one transformers"):
        load_transformers(folder)
    vision = tmp_path / "beit"
    T.BeitConfig(image_size=32, patch_size=8, **SMALL).save_pretrained(vision)
    with pytest.raises(tc.CheckpointError, match="reads pixel_values, not text"):
        load_transformers(vision)


def test_the_parameter_limit_refuses_a_huge_config_before_anything_is_allocated(tmp_path, monkeypatch):
    folder = tmp_path / "huge"
    huge = dict(hidden_size=8192, num_hidden_layers=200, num_attention_heads=64, intermediate_size=32768)
    T.AlbertConfig(vocab_size=250_000, embedding_size=8192, **huge).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not read: the size is refused first")
    with pytest.raises(tc.CheckpointError, match=r"has 3(\.0)? billion parameters.*TFORMER_MAX_PARAMS"):
        load_transformers(folder)
    monkeypatch.setenv("TFORMER_MAX_PARAMS", "1000")
    with pytest.raises(tc.CheckpointError, match="more than this server loads"):
        load_transformers(_save(_electra(), tmp_path / "small"))
    layers = tmp_path / "layers"
    T.AlbertConfig(num_hidden_layers=100_000).save_pretrained(layers)
    with pytest.raises(tc.CheckpointError, match="num_hidden_layers is 100,000: more than tformer handles"):
        load_transformers(layers)


def test_weights_of_another_architecture_and_pickles_with_code_are_refused(tmp_path):
    folder = _save(_electra(), tmp_path / "mixed")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "model_type": "albert", "architectures": ["AlbertModel"]})
    )
    with pytest.raises(tc.CheckpointError, match="do not belong together"):
        load_transformers(folder)

    pickled = tmp_path / "pickled"
    hf = _electra()
    hf.config.save_pretrained(pickled)
    torch.save(hf.state_dict(), pickled / "pytorch_model.bin")  # the older format: a pickle of tensors
    assert load_transformers(pickled).kind == "encoder"  # a plain .bin of tensors loads (weights only)

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "RAN"), "w"))

    with (pickled / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"electra.embeddings.word_embeddings.weight": Payload()}, f, protocol=2)
    with pytest.raises(tc.CheckpointError, match="holds Python objects besides tensors"):
        load_transformers(pickled)
    assert not (tmp_path / "RAN").exists()


def test_long_inputs_are_capped():
    assert TRACE_MAX_TOKENS == 1024  # the weights of every layer and head are stored: n^2 each


def test_a_config_naming_its_own_code_for_a_transformers_architecture_runs_transformers_class(tmp_path):
    """auto_map is ignored when config.json's architecture is transformers' own: that class runs, the folder's
    modules are never imported."""
    folder = _save(_electra(), tmp_path / "automap")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_custom.C", "AutoModelForMaskedLM": "modeling_custom.M"}
    for module in ("modeling_custom", "configuration_custom"):
        (folder / f"{module}.py").write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\n")
    (folder / "config.json").write_text(json.dumps(config))
    model = load_transformers(folder)
    assert model.config.architecture == "ElectraForMaskedLM" and not (folder / "RAN").exists()
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(tc.CheckpointError, match="names BertModel, which is not a electra architecture"):
        load_transformers(folder)
