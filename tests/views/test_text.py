"""The Text attention page's numbers, computed by tformer_views.text from tiny random models."""

import io
import math

import numpy as np
import pytest
from PIL import Image
from transformers import AutoTokenizer

import tformer_core as tc
from tests.core.tiny_models import _seeded, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_app import events
from tformer_app.markdown import escape
from tformer_core.checkpoints.sources import local_model_folders, minilm_folder
from tformer_views import colour, distance
from tformer_views import overview as overview_views
from tformer_views import text as tv
from tformer_views import tokens as tok
from tformer_views import why as why_views
from tformer_views.charts import attention as attention_charts
from tformer_views.charts import pickers
from tformer_views.charts.export import validate
from tformer_views.charts.spec import heatmap

IDS = [2, 17, 33, 8, 21, 5, 39, 3, 11, 30]
SENTENCE = "The cat sat on the mat because it was warm."
LONG_WORDS = " ".join(["attention looks at every word of the sentence"] * 40)  # ~320 word pieces


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(minilm_folder()))


def _with_tokenizer(model, tokenizer):
    model.attach_tokenizer(tc.HFTokenizer(tokenizer))
    return model


@pytest.fixture(scope="module")
def text_encoder(tokenizer):
    """A tiny BERT-like encoder with MiniLM's tokenizer (30522 word pieces), at most 32 tokens, MLM head."""
    return _with_tokenizer(
        _seeded(
            lambda: tc.Encoder(
                tc.EncoderConfig(
                    vocab_size=len(tokenizer),
                    max_positions=32,
                    n_layers=2,
                    d_model=16,
                    n_heads=4,
                    d_ff=32,
                    n_token_types=2,
                    mlm_head=True,
                )
            )
        ),
        tokenizer,
    )


@pytest.fixture(scope="module")
def text_decoder(tokenizer):
    return _with_tokenizer(
        _seeded(
            lambda: tc.Decoder(
                tc.DecoderConfig(
                    vocab_size=len(tokenizer), max_positions=24, n_layers=2, d_model=16, n_heads=4, d_ff=32
                )
            )
        ),
        tokenizer,
    )


@pytest.fixture(scope="module")
def enc_trace():
    return tiny_encoder().trace(IDS)


@pytest.fixture(scope="module")
def dec_trace():
    return tiny_decoder().trace(IDS)


def synthetic_trace(n_layers, n_heads, n, seed=0, kind="encoder"):
    """A Trace holding only random attention weights (rows sum to 1): enough for the overview."""
    rng = np.random.default_rng(seed)
    stack = "decoder" if kind == "decoder" else "encoder"
    acts = {}
    for layer in range(n_layers):
        w = rng.random((n_heads, n, n), dtype=np.float32) ** 4
        w /= w.sum(-1, keepdims=True)
        acts[f"{stack}.{layer}.attn.weights"] = w
    return tc.Trace(
        kind=kind,
        activations=acts,
        tokens=tuple(f"t{i}" for i in range(n)),
        n_heads=n_heads,
        stack_layers={stack: n_layers},
    )


# ---- fitting the input to the model ---------------------------------------------------------------
def test_short_input_is_left_alone(text_encoder, tokenizer):
    fitted = tc.fit_to_model(text_encoder, SENTENCE)
    assert fitted.text == SENTENCE and fitted.pair is None and fitted.n_dropped == 0
    assert fitted.n_tokens == len(tokenizer.encode(SENTENCE)) == 13
    assert fitted.max_tokens == 32


def test_long_input_is_cut_to_the_model_maximum_with_the_dropped_count(text_encoder, tokenizer):
    total = len(tokenizer.encode(LONG_WORDS))
    fitted = tc.fit_to_model(text_encoder, LONG_WORDS)
    assert LONG_WORDS.startswith(fitted.text)
    assert fitted.n_tokens == len(tokenizer.encode(fitted.text))
    # Each word of LONG_WORDS is one word piece: 320 pieces + [CLS] and [SEP] = 322; 32 keep 30 words, cut
    # between two words, not a whole sentence early.
    assert total == 322 and fitted.n_tokens == 32 and fitted.text == " ".join(LONG_WORDS.split()[:30])
    assert fitted.n_dropped == 322 - 32
    trace = text_encoder.trace(fitted.text)  # the model accepts it
    assert len(trace.tokens) == fitted.n_tokens and trace.tokens[-1] == "[SEP]"


def test_ten_thousand_words_are_cut_too(text_encoder, tokenizer):
    text = " ".join(["word"] * 10_000)
    fitted = tc.fit_to_model(text_encoder, text)
    assert fitted.n_tokens == 32 and fitted.n_dropped == 10_002 - 32  # "word" is one piece; [CLS] and [SEP]
    assert fitted.text == " ".join(["word"] * 30)


def test_text_without_spaces_is_cut_between_tokens(text_encoder, tokenizer):
    fitted = tc.fit_to_model(text_encoder, "x." * 100)  # 200 tokens and not one space
    assert fitted.text == "x." * 15 and fitted.n_tokens == 32 and fitted.n_dropped == 202 - 32


def test_pairs_are_cut_longest_first_and_both_segments_survive(text_encoder, tokenizer):
    short = "It was tired."
    fitted = tc.fit_to_model(text_encoder, LONG_WORDS, pair=short)
    assert fitted.pair == short  # the short segment is kept whole: 4 pieces (it, was, tired, .)
    # 32 - 3 ([CLS], [SEP], [SEP]) - 4 = 25 words of the long segment
    assert fitted.text == " ".join(LONG_WORDS.split()[:25]) and fitted.n_dropped == (320 + 4 + 3) - 32
    assert fitted.n_tokens == 32 == len(tokenizer(fitted.text, fitted.pair)["input_ids"])
    trace = text_encoder.trace(fitted.text, pair=fitted.pair)
    assert trace.tokens.count("[SEP]") == 2 and len(trace.tokens) == fitted.n_tokens
    both = tc.fit_to_model(text_encoder, LONG_WORDS, pair=LONG_WORDS)
    n_a, n_b = (len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (both.text, both.pair))
    assert abs(n_a - n_b) <= 1 and n_a + n_b + 3 == both.n_tokens == 32  # 29 pieces shared, 15 and 14


@pytest.mark.parametrize("text", ["", "   \n "])
def test_an_empty_sentence_is_refused(text_encoder, text):
    with pytest.raises(tc.InputError, match=r"^the sentence is empty: type at least one word$"):
        tc.fit_to_model(text_encoder, text)


def test_a_decoder_ignores_the_second_segment_and_is_cut_at_its_maximum(text_decoder, tokenizer):
    fitted = tc.fit_to_model(text_decoder, LONG_WORDS, pair="ignored")
    assert fitted.pair is None and fitted.n_tokens == 24 == len(tokenizer.encode(fitted.text))
    assert fitted.text == " ".join(LONG_WORDS.split()[:22])  # 24 positions less [CLS] and [SEP]


def test_models_this_page_cannot_show_are_named(text_encoder):
    assert tv.text_model_problem(text_encoder) is None
    assert "encoder-decoder" in tv.text_model_problem(tiny_seq2seq())
    assert "Vision Transformer" in tv.text_model_problem(tiny_vit())
    assert "no tokenizer" in tv.text_model_problem(tiny_encoder())


def test_local_model_folders_lists_only_model_folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{}")
    (tmp_path / "b").mkdir()
    assert local_model_folders([tmp_path]) == [str(tmp_path / "a")]


# ---- tokens --------------------------------------------------------------------------------------
def test_special_tokens_are_hidden_and_rows_renormalised(text_encoder):
    trace = text_encoder.trace("The cat sat.")
    assert trace.tokens == ("[CLS]", "the", "cat", "sat", ".", "[SEP]")
    w = trace.attention(1, 2).astype(np.float64)
    shown = tv.head_matrix(trace, 1, 2, hide_special=True)
    assert shown.query_labels == shown.key_labels == ("the", "cat", "sat", ".")
    np.testing.assert_array_equal(shown.queries, [1, 2, 3, 4])
    inner = w[1:5, 1:5]
    np.testing.assert_allclose(shown.weights, inner / inner.sum(1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(shown.weights.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(shown.hidden_share, w[1:5, [0, 5]].sum(1), atol=1e-6)
    assert shown.hidden_share.min() > 0
    everything = tv.head_matrix(trace, 1, 2)
    np.testing.assert_array_equal(everything.weights, w)
    assert np.all(everything.hidden_share == 0)


def test_mask_is_a_word_slot_not_a_boundary():
    tokens = ["<s>", "Ġa", "[MASK]", "</s>", "<|endoftext|>", "[CLS]", "x", "[SEP]"]
    np.testing.assert_array_equal(tok.visible_positions(tokens, True), [1, 2, 6])
    np.testing.assert_array_equal(tok.visible_positions(tokens, False), range(8))


def test_tokens_are_shown_with_visible_spaces_and_escaped_for_markdown():
    assert tok.display_tokens(["Ġit", "▁le", "##ing", "Ċ", ""]) == ["␣it", "␣le", "##ing", "↵", "∅"]
    escaped = escape("<b>x</b> *y* [z](u)")
    assert escaped == r"\<b\>x\</b\> \*y\* \[z\]\(u\)"
    assert "<b>" not in escaped


def test_byte_level_tokens_are_shown_as_the_text_they_stand_for():
    """GPT-2-style vocabularies write bytes as characters: "’" is the three bytes e2 80 99, written "âĢĻ"."""
    assert tok.display_tokens(["âĢĻ", "ĠÃ©t", "Ġä¸Ń", "ĉ", "č"]) == ["’", "␣ét", "␣中", "⇥", "\\r"]
    assert tok.display_token("âĢ") == "\\xe2\\x80"  # a piece of a character: its bytes
    # WordPiece and sentencepiece words with Latin-1 letters are not byte-level tokens: shown as written.
    assert tok.display_tokens(["café", "über", "▁Straße", "##é"]) == ["café", "über", "␣Straße", "##é"]
    # Parity with the tokenizers library's own byte-level decoder, over every byte a token can hold.
    from tokenizers import decoders

    reference = decoders.ByteLevel()
    for text in ["naïve café ’quoted’ — 中文 😀", " x\ty"]:
        written = "".join({b: c for c, b in tok.BYTE_LEVEL.items()}[b] for b in text.encode())
        assert reference.decode([written]) == text
        shown = tok.display_token(written)
        assert shown == text.replace(" ", "␣").replace("\t", "⇥")


def test_a_character_split_over_byte_level_tokens_is_shown_on_each_piece():
    """SmolLM2 writes "ồ" (e1 bb 93) as "á»" + "ĵ", and " 🐱" (20 f0 9f 90 b1) as "ĠðŁ" + "Ĳ" + "±": each piece
    shows the character it belongs to and which piece it is, never raw bytes; whole characters are left alone."""
    tokens = ["Con", "Ġm", "Ã¨", "o", "Ġng", "á»", "ĵ", "i", "ĠðŁ", "Ĳ", "±", "Ġá", "»", "ĵ"]
    assert tok.display_tokens(tokens) == [
        "Con", "␣m", "è", "o", "␣ng", "ồ(1/2)", "ồ(2/2)", "i", "␣🐱(1/3)", "🐱(2/3)", "🐱(3/3)",
        "␣ồ(1/3)", "ồ(2/3)", "ồ(3/3)",
    ]  # fmt: skip
    # The pieces' bytes are the character's: the label is what the tokenizers library decodes them to.
    from tokenizers import decoders

    assert decoders.ByteLevel().decode(tokens[5:7]) == "ồ" and decoders.ByteLevel().decode(tokens[8:11]) == " 🐱"
    # A piece whose character is never finished, and WordPiece words, stay as they were shown.
    assert tok.display_tokens(["âĢ", "x"]) == ["\\xe2\\x80", "x"]
    assert tok.display_tokens(["café", "##s", "über"]) == ["café", "##s", "über"]


def test_a_predicted_piece_is_shown_as_the_character_it_completes():
    assert tok.display_next(["Ġng", "á»"], "ĵ") == "ồ(2/2)"  # the context ends inside "ồ"
    assert tok.display_next(["ĠðŁ", "Ĳ"], "±") == "🐱(3/3)"
    assert tok.display_next(["ĠðŁ"], "Ĳ") == "⟨part of a character⟩"  # a third byte of four
    assert tok.display_next(["Ġng"], "á»") == "⟨start of a character⟩"  # begins one it does not finish
    assert tok.display_next(["Ġ"], "ĠðŁ") == "␣⟨start of a character⟩"
    assert tok.display_next(["the"], "Ġcat") == "␣cat" and tok.display_next([], "##s") == "##s"
    assert tok.ends_inside_a_character(["Ġa", "ĠðŁ"]) and not tok.ends_inside_a_character(["ĠðŁ", "Ĳ", "±"])


def test_what_a_tokenizer_changed_in_the_text_is_said():
    assert tok.text_changes("Con mèo ngồi 🐱", ["[CLS]", "con", "me", "##o", "ngo", "##i", "[UNK]", "[SEP]"]) == [
        "lowercases it",
        "strips accents (mèo → meo)",
        "has no token for 🐱, written [UNK]",
    ]
    assert tok.text_changes("the cat", ["[CLS]", "the", "cat", "[SEP]"]) == []
    assert tok.text_changes("Con mèo 🐱", ["Con", "Ġm", "Ã¨", "o", "ĠðŁ", "Ĳ", "±"]) == []  # byte-level: exact


def test_token_window_stays_inside_the_input():
    assert tok.token_window(100, 0, 64) == slice(0, 64)
    assert tok.token_window(100, 90, 64) == slice(36, 100)
    assert tok.token_window(10, 5, 64) == slice(0, 10)


# ---- the overview picture -------------------------------------------------------------------------
def test_overview_thumbnails_are_the_attention_and_pixels_follow_it(enc_trace):
    ov = overview_views.overview(enc_trace)
    L, H, n = 2, 4, len(IDS)
    assert ov.thumbs.shape == (L, H, n, n) and ov.block == 1 and ov.zoom == 64 // n == 6
    np.testing.assert_allclose(ov.thumbs, enc_trace.all_attention(), atol=1e-7)
    image = np.asarray(Image.open(io.BytesIO(ov.png)).convert("RGB"))
    margin_x, margin_y = ov.origin  # room for the L0.. and H0.. labels
    assert image.shape == (margin_y + L * (60 + ov.gap), margin_x + H * (60 + ov.gap), 3)
    lut = colour.lut("viridis")
    for layer in range(L):
        for head in range(H):
            left, top, right, bottom = ov.box(layer, head)
            crop = image[top:bottom, left:right]
            w = enc_trace.attention(layer, head)
            expected = lut[np.rint(w / w.max() * 255).astype(int)].repeat(6, 0).repeat(6, 1)
            np.testing.assert_array_equal(crop, expected)
            # Viridis' green channel rises with the value: sorted by weight, the pixels only get greener.
            green = crop[::6, ::6, 1].astype(int).ravel()[np.argsort(w.ravel(), kind="stable")]
            assert np.all(np.diff(green) >= 0) and green[-1] == lut[255, 1]


def test_long_inputs_are_block_averaged_to_at_most_64_pixels():
    trace = synthetic_trace(2, 3, 130)
    ov = overview_views.overview(trace)
    assert ov.block == 3 and ov.thumbs.shape == (2, 3, 44, 44) and max(ov.cell_px) <= 64
    w = trace.attention(1, 2).astype(np.float64)
    np.testing.assert_allclose(ov.thumbs[1, 2, 0, 0], w[0:3, 0:3].mean(), rtol=1e-6)  # float32 sums on a GPU
    np.testing.assert_allclose(ov.thumbs[1, 2, 5, 43], w[15:18, 129].mean(), atol=1e-12)  # last block: one key
    np.testing.assert_allclose(ov.thumbs[1, 2, 43, 43], w[129, 129], atol=1e-12)


def test_overview_of_a_bert_base_sized_input_fits_the_payload_budget():
    trace = synthetic_trace(12, 12, 512)
    ov = overview_views.overview(trace)
    assert ov.thumbs.shape == (12, 12, 64, 64) and ov.block == 8
    raw = 12 * 12 * 512 * 512 * 4
    assert len(ov.png) <= 3 * 2**20, f"{len(ov.png)} bytes"
    assert len(ov.png) * 50 < raw  # far less than the float32 weights themselves (151 MB)
    w = trace.attention(7, 3).astype(np.float64)
    np.testing.assert_allclose(ov.thumbs[7, 3], w.reshape(64, 8, 64, 8).mean((1, 3)), atol=1e-9)


def test_causal_masks_are_grey_in_the_overview_and_in_the_heatmap(dec_trace):
    n = len(IDS)
    m = tv.head_matrix(dec_trace, 1, 0)
    np.testing.assert_array_equal(m.allowed, np.tril(np.ones((n, n), dtype=bool)))
    np.testing.assert_array_equal(m.masked, ~m.allowed)
    # The heatmap's masked cells: no colour value (drawn grey, not filtered out), their weight 0 as their text.
    spec = heatmap(m.weights, m.query_labels, m.key_labels, masked=m.masked)
    cells = next(iter(spec["datasets"].values()))
    upper = (cells["col"] > cells["row"]).to_numpy()
    assert cells.loc[upper, "value"].isna().all() and (cells.loc[upper, "label"] == "0").all()
    assert cells.loc[~upper, "value"].notna().all()
    assert spec["layer"][0]["mark"]["invalid"] == "show"
    ov = overview_views.overview(dec_trace)
    assert np.all(np.isnan(ov.thumbs[:, :, 0, 1:])) and not np.isnan(ov.thumbs[:, :, 1:, 0]).any()
    image = np.asarray(Image.open(io.BytesIO(ov.png)).convert("RGB"))
    left, top, right, bottom = ov.box(1, 2)
    assert tuple(image[top, right - 1]) == colour.MASKED_RGB  # top-right: query 0 cannot see the last key
    assert tuple(image[bottom - 1, left]) != colour.MASKED_RGB


def test_overview_and_head_matrix_serve_cross_attention(tmp_path):
    trace = tiny_seq2seq().trace([3, 4, 5, 6, 7, 8], [1, 9, 10, 11])
    m = tv.head_matrix(trace, 2, 1, stack="cross")
    assert m.weights.shape == (4, 6) and m.query_labels == ("1", "9", "10", "11")
    ov = overview_views.overview(trace, stack="cross")
    assert ov.thumbs.shape[:2] == (3, 4)
    np.testing.assert_allclose(ov.thumbs[2, 1], trace.attention(2, 1, "cross"), atol=1e-7)


def test_clicked_cells_are_read_from_a_selection_event():
    assert events.clicked_cell({"selection": {"cell": [{"layer": 4, "head": 7}]}}) == (4, 7)
    assert events.clicked_cell({"selection": {"cell": []}}) is None
    assert events.clicked_cell(None) is None
    spec = pickers.head_grid_chart(np.arange(6.0).reshape(2, 3), (1, 2))
    validate(spec)
    assert [p["name"] for p in spec["params"]] == ["cell"]
    assert spec["params"][0]["select"]["fields"] == ["layer", "head"]


# ---- why this weight -----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["encoder", "decoder", "cross", "t5-bias"])
def test_why_this_weight_reproduces_the_weights_and_the_head_output(which, enc_trace, dec_trace):
    stack = None
    if which == "encoder":
        trace = enc_trace
    elif which == "decoder":
        trace = dec_trace
    elif which == "cross":
        trace, stack = tiny_seq2seq().trace([3, 4, 5, 6, 7, 8], [1, 9, 10, 11]), "cross"
    else:  # relative position bias, no 1/sqrt(d_k): T5's recipe
        model = _seeded(
            lambda: tc.EncoderDecoder(
                tc.Seq2SeqConfig(
                    src_vocab_size=30,
                    tgt_vocab_size=30,
                    max_positions=32,
                    n_encoder_layers=2,
                    n_decoder_layers=2,
                    d_model=16,
                    n_heads=4,
                    d_ff=32,
                    rel_pos_buckets=8,
                    rel_pos_max_distance=16,
                    scale_attention=False,
                    norm="pre",
                )
            )
        )
        trace, stack = model.trace([3, 4, 5, 6, 7, 8], [1, 9, 10]), "encoder"
    for layer, head, query in ((0, 0, 0), (1, 3, 2), (1, 1, 3)):
        why = why_views.why_this_weight(trace, layer, head, query, stack)
        np.testing.assert_allclose(why.weights, trace.attention(layer, head, stack)[query], atol=1e-6)
        np.testing.assert_allclose(why.z, trace.block("z", layer, head, stack)[query], atol=1e-6)
        np.testing.assert_allclose(why.dots, trace.block("scores", layer, head, stack)[query], rtol=1e-5, atol=1e-6)
        scaled = trace.block("scaled", layer, head, stack)[query]
        assert np.array_equal(np.isneginf(why.logits), np.isneginf(scaled))
        np.testing.assert_allclose(why.logits[np.isfinite(scaled)], scaled[np.isfinite(scaled)], rtol=1e-5, atol=1e-5)
        assert max(why.max_errors()) < 1e-6
        table = why.table()
        assert table["weight"].sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(table["‖w_j·v_j‖"], why.weights * np.linalg.norm(why.v, axis=1))
        terms = why.products(1 if why.k.shape[0] > 1 else 0)
        assert terms["q × k_j"].sum() == pytest.approx(why.dots[1 if why.k.shape[0] > 1 else 0])
    d_head = trace.q(0, 0, stack).shape[1]
    if which == "t5-bias":
        assert why.scale == 1.0 and why.bias is not None and np.abs(why.bias).max() > 0
    else:
        assert why.scale == pytest.approx(1 / math.sqrt(d_head)) and why.bias is None
    if which == "decoder":
        why = why_views.why_this_weight(trace, 1, 2, 3)
        assert list(why.allowed) == [True] * 4 + [False] * (len(IDS) - 4)
        assert np.all(why.weights[4:] == 0) and np.all(np.isneginf(why.logits[4:]))


def test_why_this_weight_refuses_a_query_outside_the_input(enc_trace):
    with pytest.raises(tc.InputError, match=r"^query position 10 is out of range: the input has 10 tokens \(0\.\.9\)$"):
        why_views.why_this_weight(enc_trace, 0, 0, len(IDS))


# ---- head view -------------------------------------------------------------------------------------
def test_head_view_draws_the_attention_weights(enc_trace):
    view = tv.head_view(enc_trace, 1, heads=[0, 2], min_weight=0.0)
    assert view.heads == (0, 2) and len(view.lines) == 2 * len(IDS) ** 2
    w = enc_trace.attention(1)
    for row in view.lines.sample(20, random_state=0).itertuples():
        assert row.weight == pytest.approx(w[row.head, row.query, row.key])
    strong = tv.head_view(enc_trace, 1, heads=[1], max_lines=7)
    assert len(strong.lines) == 7
    assert strong.threshold == pytest.approx(np.sort(w[1].ravel())[-7])
    focused = tv.head_view(enc_trace, 1, heads=[0, 1, 2, 3], focus=4)
    assert set(focused.lines["query"]) == {4}
    spec = attention_charts.head_view_chart(focused, 4)
    validate(spec)
    assert [p["name"] for p in spec["params"]] == ["focus", "heads"] and spec["params"][0]["select"]["fields"] == [
        "query"
    ]


def test_head_view_of_a_window_and_hidden_tokens(text_encoder):
    trace = text_encoder.trace("The cat sat on the mat.")
    view = tv.head_view(trace, 0, heads=[1], hide_special=True, window=slice(1, 4), min_weight=0.0)
    assert list(view.queries["token"]) == ["cat", "sat", "on"] and len(view.lines) == 9
    assert 0 < view.hidden_share < 1


# ---- attention distance ----------------------------------------------------------------------------
def test_distance_grid_is_mean_token_distance_per_layer_and_head(enc_trace):
    grid = distance.token_distances(enc_trace)
    w = enc_trace.all_attention().astype(np.float64)  # [layers, heads, n, n]
    n = w.shape[-1]
    offsets = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    expected = np.array([[np.mean([w[l, h, i] @ offsets[i] for i in range(n)]) for h in range(4)] for l in range(2)])
    assert grid.shape == (2, 4)
    np.testing.assert_allclose(grid, expected, rtol=1e-6)


def test_uniform_baselines_match_the_formulas(enc_trace, dec_trace):
    n = len(IDS)
    assert distance.uniform_token_distance(enc_trace) == pytest.approx((n * n - 1) / (3 * n))
    assert distance.uniform_token_distance(dec_trace) == pytest.approx((n - 1) / 4)


def test_distance_chart_has_one_dot_per_head_and_the_baseline(enc_trace):
    spec = attention_charts.distance_chart(distance.token_distances(enc_trace), 3.3, 4, (1, 2))
    validate(spec)
    datasets = list(spec["datasets"].values())
    assert sorted(len(d) for d in datasets) == [1, 8]
    dots = next(d for d in datasets if len(d) == 8)
    assert dots["chosen"].sum() == 1 and tuple(dots.loc[dots["chosen"], ["layer", "head"]].iloc[0]) == (1, 2)


# ---- predictions -------------------------------------------------------------------------------------
def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_masked_word_top5_come_from_the_head(text_encoder, tokenizer):
    assert tv.mask_token(text_encoder) == "[MASK]" and tv.mask_token(tiny_encoder()) is None
    trace = text_encoder.trace("The cat [MASK] on the mat.")
    assert tv.prediction_kind(trace) == "masked-word" and trace.meta["mask_positions"] == [3]
    top = tv.top_predictions(trace, 5, 3)
    p = _softmax(trace["head.logits"][3].astype(np.float64))
    best = np.argsort(-p)[:5]
    assert [label for label, _ in top] == [tok.display_token(tokenizer.convert_ids_to_tokens(int(i))) for i in best]
    np.testing.assert_allclose([q for _, q in top], p[best], rtol=1e-6)


def test_next_token_top5_and_no_head(text_decoder, enc_trace):
    trace = text_decoder.trace("the cat sat")
    assert tv.prediction_kind(trace) == "next-token"
    p = _softmax(trace["head.logits"][-1].astype(np.float64))
    np.testing.assert_allclose([q for _, q in tv.top_predictions(trace, 5)], np.sort(p)[::-1][:5], rtol=1e-6)
    p1 = _softmax(trace["head.logits"][1].astype(np.float64))
    np.testing.assert_allclose([q for _, q in tv.top_predictions(trace, 5, 1)], np.sort(p1)[::-1][:5], rtol=1e-6)
    assert tv.prediction_kind(enc_trace) is None  # an encoder without a masked-word head
    with pytest.raises(
        tc.InputError,
        match=r"^this model has no prediction head \(no classifier, language-model or masked-word head\)$",
    ):
        tv.top_predictions(enc_trace)


def test_head_view_isolates_a_head_from_its_legend_and_draws_the_strongest_line_on_top(enc_trace):
    view = tv.head_view(enc_trace, 1, range(enc_trace.n_heads))
    spec = attention_charts.head_view_chart(view, enc_trace.n_heads)
    validate(spec)
    legend = next(p for p in spec["params"] if p.get("bind") == "legend")
    assert legend["select"]["fields"] == ["head"] and legend["views"] == ["lines"]
    lines_layer = spec["layer"][0]
    assert lines_layer["encoding"]["strokeOpacity"]["condition"]["test"] == {
        "and": [{"param": "focus", "empty": True}, {"param": "heads", "empty": True}]
    }
    drawn = spec["datasets"][lines_layer["data"]["name"]]
    assert drawn["weight"].is_monotonic_increasing  # drawn in this order: where lines overlap, the strongest is on top
    assert lines_layer["encoding"]["order"]["field"] == "weight"
