"""Both kinds of tokenizer behind the core's one interface: a checkpoint's own (MiniLM's word pieces) and
the bundled translator's word tokenizer; the models read text only through that interface."""

import pytest
from transformers import AutoTokenizer

import tformer_core as tc
from tformer_core.bundled import WordTokenizer
from tformer_core.checkpoints.sources import minilm_folder
from tformer_train import data as td


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(str(minilm_folder()))


@pytest.fixture(scope="module")
def pieces(hf):
    return tc.HFTokenizer(hf)


def test_both_kinds_offer_the_protocol(pieces):
    assert isinstance(pieces, tc.Tokenizer)
    assert isinstance(WordTokenizer(td.SOURCE_VOCAB), tc.Tokenizer)


def test_word_pieces_encode_count_and_cut_as_the_checkpoint_does(pieces, hf):
    text = "The cat sat on the mat."
    assert pieces.encode(text) == hf(text)["input_ids"]
    assert pieces.count(text) == len(hf(text)["input_ids"]) == pieces.count_content(text) + 2  # [CLS], [SEP]
    ids, types = pieces.encode_pair("The cat sat.", "It was warm.")
    assert ids == hf("The cat sat.", "It was warm.")["input_ids"] and types == [0] * 6 + [1] * 5
    assert pieces.cut_points("tokenization playgrounds") == [5, 12, 23, 24]  # token ##ization playground ##s
    assert pieces.convert_ids_to_tokens(pieces.encode("playgrounds")) == ["[CLS]", "playground", "##s", "[SEP]"]
    assert pieces.decode(pieces.encode("The cat sat.")) == "the cat sat."
    assert pieces.mask_token == "[MASK]" and pieces.mask_token_id == hf.mask_token_id
    labels = pieces.labels(len(hf) + 2)
    assert labels[hf.mask_token_id] == "[MASK]" and labels[-2:] == [f"<{len(hf)}>", f"<{len(hf) + 1}>"]


def test_word_pieces_report_what_becomes_unknown(pieces):
    assert pieces.unknown_words("a cat 🐱 and a dog") == ["🐱"]  # MiniLM reads the emoji as [UNK]
    assert pieces.unknown_words("a cat and a dog") == []


def test_the_word_tokenizer_keeps_unknown_words_visible():
    source = WordTokenizer(td.SOURCE_VOCAB)
    target = WordTokenizer(td.TARGET_VOCAB, prepend_bos=True)
    assert source.encode("The big Dog sleeps.") == source.encode_target("the big dog sleeps")
    assert source.convert_ids_to_tokens(source.encode("the purple dog")) == ["the", "<unk>", "dog"]
    assert source.unknown_words("the purple dog, the purple cat") == ["purple"]
    assert target.encode("varo ta")[0] == target.bos_id and target.encode_target("varo ta")[0] != target.bos_id
    assert source.count("the big dog") == 3 and source.cut_points("the big dog") == [3, 7, 11]
    with pytest.raises(ValueError, match=r"^the bundled translator reads one sentence, not a pair$"):
        source.encode_pair("the dog", "a cat")


def test_attaching_a_tokenizer_labels_the_head(pieces):
    model = tc.Encoder(tc.EncoderConfig(vocab_size=len(pieces), n_layers=1, d_model=8, n_heads=2, mlm_head=True))
    model.attach_tokenizer(pieces)
    assert model.mask_token_id == pieces.mask_token_id and model.output_labels[pieces.mask_token_id] == "[MASK]"
    trace = model.trace("The cat [MASK] on the mat.")
    assert trace.meta["mask_positions"] == [3]
    assert all(label in model.output_labels for label, _ in trace.predictions(5))
