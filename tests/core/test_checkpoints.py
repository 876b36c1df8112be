"""Hugging Face checkpoints of the encoder, decoder-only and ViT families, loaded into the core and
compared with transformers' eager forward on the same weights and inputs (no network)."""

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import assert_close, perturbed, roundtrip

IDS = [[2, 17, 33, 8, 61, 5, 90, 3]]


def _bert_like(kind):
    common = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    if kind == "bert":
        return T.BertForMaskedLM(T.BertConfig(**common, type_vocab_size=2))
    if kind == "bert-no-head":
        return T.BertModel(T.BertConfig(**common, type_vocab_size=2), add_pooling_layer=False)
    if kind == "roberta":
        return T.RobertaForMaskedLM(T.RobertaConfig(**common, type_vocab_size=1, pad_token_id=1))
    return T.DistilBertForMaskedLM(
        T.DistilBertConfig(
            vocab_size=99,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=37,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
    )


@pytest.mark.parametrize("kind", ["bert", "bert-no-head", "roberta", "distilbert"])
def test_bert_family_parity(kind, tmp_path):
    torch.manual_seed(0)
    hf = perturbed(_bert_like(kind))
    model = roundtrip(hf, tmp_path)
    assert isinstance(model, tc.Encoder) and model.config.mlm_head == (kind != "bert-no-head")
    types = [0, 0, 0, 0, 1, 1, 1, 1] if kind == "bert" else None
    trace = model.trace(IDS[0], token_type_ids=types)
    kwargs = {"token_type_ids": torch.tensor([types])} if types else {}
    with torch.no_grad():
        out = hf(torch.tensor(IDS), output_attentions=True, output_hidden_states=True, **kwargs)
    assert_close(trace["encoder.out"], out.hidden_states[-1][0], what="final hidden states")
    if kind != "bert-no-head":
        assert_close(trace["head.logits"], out.logits[0], what="masked-LM logits")
    for layer, weights in enumerate(out.attentions):
        assert_close(trace.attention(layer), weights[0], what=f"layer {layer} attention")


def test_bert_padding_batch_parity(tmp_path):
    torch.manual_seed(1)
    hf = perturbed(_bert_like("bert"))
    model = roundtrip(hf, tmp_path)
    ids = torch.tensor([IDS[0], IDS[0][:5] + [0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        ours = model(ids, mask)
    assert_close(ours[1, :5], theirs[1, :5], what="padded sequence, real tokens")
    assert_close(ours[0], theirs[0], what="unpadded sequence")


def test_masked_word_predictions_come_from_the_head(tmp_path):
    torch.manual_seed(2)
    hf = perturbed(_bert_like("bert"))
    model = roundtrip(hf, tmp_path)
    model.mask_token_id = 61  # what a tokenizer with [MASK] = 61 would tell the loader
    trace = model.trace(IDS[0])
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor(IDS)).logits[0, 4], -1).numpy()
    top = trace.predictions(k=3)
    assert [int(label) for label, _ in top] == list(np.argsort(-p)[:3])
    np.testing.assert_allclose([q for _, q in top], np.sort(p)[::-1][:3], atol=1e-5)
    model.mask_token_id = None
    with pytest.raises(
        tc.InputError, match=r"^no \[MASK\] token in the input: put \[MASK\] where a word should be guessed$"
    ):
        model.trace(IDS[0]).predictions()


def _gpt2():
    return T.GPT2LMHeadModel(
        T.GPT2Config(
            vocab_size=99,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=64,
            bos_token_id=98,
            eos_token_id=98,
            attn_implementation="eager",
        )
    )


def test_gpt2_parity_and_predictions(tmp_path):
    torch.manual_seed(3)
    hf = perturbed(_gpt2())
    model = roundtrip(hf, tmp_path)
    assert isinstance(model, tc.Decoder)
    trace = model.trace(IDS[0])
    with torch.no_grad():
        out = hf(torch.tensor(IDS), output_attentions=True)
    assert_close(trace["head.logits"], out.logits[0], what="logits")
    for layer, weights in enumerate(out.attentions):
        assert_close(trace.attention(layer), weights[0], what=f"layer {layer} attention")
        assert np.all(np.triu(trace.attention(layer), 1) == 0)
    p = torch.softmax(out.logits[0, -1], -1).numpy()
    assert [int(t) for t, _ in trace.predictions(k=4)] == list(np.argsort(-p)[:4])


def test_gpt2_greedy_generation_matches_transformers(tmp_path):
    torch.manual_seed(4)
    hf = perturbed(_gpt2(), scale=0.3)
    model = roundtrip(hf, tmp_path)
    ours = model.generate(IDS[0][:4], max_new_tokens=10)
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([IDS[0][:4]]), max_new_tokens=10, do_sample=False, num_beams=1, pad_token_id=98
        )
    assert list(ours.ids) == theirs[0].tolist()
    assert len(ours.steps) == len(ours.generated_ids)
    # Step t's last attention row is row (prompt + t - 1) of the final teacher-forced pass.
    for t, step in enumerate(ours.steps):
        np.testing.assert_allclose(step.attention(2, 1)[-1], ours.trace.attention(2, 1)[3 + t, : 4 + t], atol=1e-6)


def _vit(kind):
    common = dict(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=7,
        attn_implementation="eager",
    )
    if kind == "vit":
        return T.ViTForImageClassification(T.ViTConfig(**common))
    if kind == "deit-teacher":
        return T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**common))
    return T.DeiTForImageClassification(T.DeiTConfig(**common))


@pytest.mark.parametrize("kind", ["vit", "deit-teacher", "deit"])
def test_vit_family_parity(kind, tmp_path):
    torch.manual_seed(5)
    hf = perturbed(_vit(kind))
    model = roundtrip(hf, tmp_path)
    assert model.config.n_prefix_tokens == (1 if kind == "vit" else 2)
    image = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))
    trace = model.trace(image)
    with torch.no_grad():
        out = hf(pixel_values=image[None], output_attentions=True)
    assert_close(trace["head.logits"], out.logits[0], what="logits")
    for layer, weights in enumerate(out.attentions):
        assert_close(trace.attention(layer), weights[0], what=f"layer {layer} attention")
    labels = [label for label, _ in trace.predictions(k=7)]
    assert labels[0] == hf.config.id2label[int(out.logits[0].argmax())]


@pytest.mark.parametrize(
    "source, message",
    [
        ("", "^no model given: choose a bundled model, a hub id or a local folder$"),
        (
            "https://huggingface.co/bert-base-uncased",
            r"^'https://huggingface\.co/bert-base-uncased' is not a model id: ",
        ),
        ("owner/name/extra", "^'owner/name/extra' is not a model id: use the hub's owner/name form"),
        ("bad..name", r"^'bad\.\.name' is not a model id: "),
        ("/etc", r"model folders \(models\); this path is outside them"),  # the path itself is not echoed
        ("../../etc", r"model folders \(models\); this path is outside them"),
    ],
)
def test_bad_sources_are_refused_with_a_reason(source, message):
    with pytest.raises(tc.CheckpointError, match=message):
        tc.load_model(source)


def test_local_folders_are_checked_after_following_links(tmp_path):
    """A models folder reached through a link still holds its models; a link out of it does not."""
    from tformer_core.checkpoints.sources import local_folder

    real = tmp_path / "real"
    (real / "m").mkdir(parents=True)
    (real / "m" / "config.json").write_text("{}")
    linked = tmp_path / "linked"
    linked.symlink_to(real)
    assert local_folder(str(linked / "m"), [linked]) == (real / "m").resolve()
    assert local_folder(str(real / "m"), [linked]) == (real / "m").resolve()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (real / "escape").symlink_to(outside)
    with pytest.raises(tc.CheckpointError, match=r"model folders \(linked\); this path is outside them"):
        local_folder(str(linked / "escape"), [linked])


def test_unsupported_architecture_says_so(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "surely-not-a-model"}')
    with pytest.raises(tc.CheckpointError, match="not supported yet: surely-not-a-model"):
        tc.load_model(str(folder), model_dirs=[tmp_path])


def test_uncached_hub_id_offline_fails_fast_with_advice():
    with pytest.raises(tc.CheckpointError, match=r"not in the local cache.*works offline \(minilm, smollm2"):
        tc.load_model("someone/surely-not-cached-model")


def _point_hub_at(monkeypatch, tmp_path, endpoint: str) -> None:
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "ENDPOINT", endpoint)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path))


def test_refused_hub_connection_gives_advice(monkeypatch, tmp_path):
    _point_hub_at(monkeypatch, tmp_path, "http://127.0.0.1:9")  # loopback port nobody listens on
    with pytest.raises(tc.CheckpointError, match=r"hub cannot be reached.*not in the local cache"):
        tc.load_model("google/vit-base-patch16-224")


def test_a_hub_that_never_answers_is_given_up_after_the_timeout(monkeypatch, tmp_path):
    """A loopback server that accepts connections and never replies: without a timeout the call would hang.

    The load runs in a thread; the test waits for it to finish (the condition), with a generous limit only
    to report a hang instead of blocking the suite.
    """
    import socket
    import threading

    from tformer_core.checkpoints import sources

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    _point_hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(sources, "HUB_TIMEOUT_S", 0.2)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            tc.load_model("google/vit-base-patch16-224")
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(120)
    listener.close()
    assert not worker.is_alive(), "load_model kept waiting for a hub that never answers"
    assert isinstance(outcome[0], tc.CheckpointError)
    assert "hub cannot be reached (ReadTimeout)" in str(outcome[0]), outcome[0]


def test_progress_is_reported_up_to_one():
    seen = []
    tc.load_model("minilm", device="cpu", progress=lambda f, msg: seen.append((f, msg)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) >= 4
    assert all(isinstance(m, str) and m for _, m in seen)
