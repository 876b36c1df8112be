"""Links are input too: every value a URL brings is checked, and what is changed or dropped is said in one line.

Each case was found by opening a tampered link in the live app: sliders given values outside their range
(or nan / inf) raised Streamlit's ValueAbove/BelowMin errors, and other values were reset silently.
"""

from __future__ import annotations

import pytest

from tests.app.pages import messages, no_exception, run, widget
from tformer_app.url import MAX_LINK_VALUE, finite_float


def link_line(at) -> str:
    lines = [m for m in messages(at, "info") if m.startswith("From the link:") or "Not in the link" in m]
    assert len(lines) == 1, messages(at, "info")
    return lines[0]


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"alpha": "5"}, ["alpha=5 is outside 0.2..0.9; using 0.9"]),
        (
            {"alpha": "nan", "discard": "inf"},
            ["alpha=nan is not a finite number", "discard=inf is not a finite number"],
        ),
        ({"discard": "-3"}, ["discard=-3 is outside 0..0.99; using 0.0"]),
        ({"layer": "99", "head": "x"}, ["layer=99 is not one of the choices here", "head=x is not a valid value"]),
        ({"smooth": "maybe", "fusion": "median"}, ["smooth=maybe is not a valid value", "fusion=median is not one of"]),
        ({"sample": "../../etc/passwd"}, ["sample=../../etc/passwd is not one of the choices here"]),
    ],
)
def test_tampered_vision_links_are_clamped_or_dropped_and_said_so(params, expected):
    at = run("vision", timeout=120, model="vit-tiny", **params)
    no_exception(at)
    line = link_line(at)
    for part in expected:
        assert part in line
    assert 0.2 <= at.slider(key="vit.alpha").value <= 0.9
    assert 0.0 <= at.slider(key="vit.discard").value <= 0.99


def test_parameters_a_page_does_not_know_are_named_as_ignored():
    at = run("text_attention", head="3", colour="red", evil="<script>")
    no_exception(at)
    line = link_line(at)
    assert "ignored colour, evil" in line
    assert at.selectbox(key="text.head").value == 3  # the valid parameter still applies
    assert "colour" not in at.query_params


def test_lists_from_a_link_keep_only_what_is_offered():
    at = run("text_attention", heads="0,5,99,-1", views="heatmap,nonsense")
    no_exception(at)
    line = link_line(at)
    assert "heads: left out 99,-1" in line and "views: left out nonsense" in line
    assert widget(at, "text.views").value == ["heatmap"]


def test_a_valid_link_gets_no_message():
    at = run("text_attention", head="3", layer="2")
    no_exception(at)
    assert not [m for m in messages(at, "info") if "link" in m]


def test_a_text_too_long_for_a_link_stays_out_of_it_with_a_note():
    """A 100 KB sentence in the address made the server answer HTTP 400: the link keeps everything else."""
    at = run("text_attention")
    long_text = "word " * 20_000
    at.text_area(key="text.text").input(long_text).run()
    no_exception(at)
    assert "text" not in at.query_params and "layer" in at.query_params
    assert "Not in the link (too long to share in an address): the sentence" in link_line(at)
    assert len(long_text) > MAX_LINK_VALUE
    # The link made now says what it could not carry; opened, it says so instead of "ignored start".
    assert at.query_params["cut"] == "text" and "start" in at.query_params  # the long text's window
    params = {k: at.query_params[k] for k in at.query_params}
    opened = run("text_attention", **params)
    no_exception(opened)
    line = link_line(opened)
    assert "the sentence did not fit in the link (too long for an address) and was left out" in line
    assert "start went with it and cannot be used" in line and "ignored" not in line
    assert opened.text_area(key="text.text").value.startswith("The animal")  # the page's own sentence


def test_a_link_to_an_uploaded_pictures_view_keeps_its_settings_until_there_is_a_picture():
    """Uploads stay in the browser: the link says so (not "ignored layer, head ..."), keeps the view's settings,
    and they apply to the picture chosen here."""
    at = run("vision", timeout=120, model="vit-tiny", **{"from": "upload"}, layer="2", head="1", alpha="0.4")
    no_exception(at)
    line = link_line(at)
    assert "an uploaded picture is not in links" in line and "ignored" not in line
    assert "layer" in line and "alpha" in line
    assert (at.query_params["layer"], at.query_params["head"], at.query_params["alpha"]) == ("2", "1", "0.4")
    at.radio(key="vit.from").set_value("sample").run()  # a picture here: the link's settings are its settings
    no_exception(at)
    assert at.slider(key="vit.alpha").value == 0.4 and at.query_params["layer"] == "2"
    assert at.query_params["head"] == "1" and "ignored" not in " ".join(messages(at, "info"))


def test_a_number_from_a_link_is_finite_or_refused():
    assert finite_float("2.5") == 2.5 and finite_float("1e-5") == 1e-5
    for raw, message in (("inf", "^inf$"), ("-inf", "^-inf$"), ("nan", "^nan$"), ("ten", "^could not convert string")):
        with pytest.raises(ValueError, match=message):
            finite_float(raw)


@pytest.mark.parametrize("page, model, key", [("vision", "vit-tiny", "vit"), ("head_matters", "translator", "heads")])
def test_every_run_tells_the_model_box_its_model(page, model, key):
    """The Model box is told its model on every run, not only the first: a box the browser mounts afresh (a first
    run cut short by a click) otherwise shows the list's first model and sends it back with the next change of any
    widget. In CI, the vision page opened on vit-tiny became DeiT-Tiny when a patch size was typed, and the heads
    page's translator became smollm2 when its grid was clicked."""
    at = run(page, timeout=120, model=model)
    at.run(timeout=120)  # a later run: no longer the session's first
    no_exception(at)
    box = at.selectbox(key=f"{key}.model_choice")
    assert box.value == model and box.options[0] != model  # a box mounted afresh would show another model
    assert box.proto.set_value  # the browser is told the value, whatever its box holds
