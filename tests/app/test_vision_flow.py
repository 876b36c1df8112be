"""The Vision page's "How information flows to the class token" through AppTest on the bundled vit-tiny: folded and
computed only when asked, one pass of its own; what it draws is the core's rollout of an independent pass; the
layer slider moves the picture's map without a pass; it is in the link."""

from __future__ import annotations

import gc
import types

import numpy as np
import pandas as pd

import tformer_core as tc
from tests.app.pages import charts, no_exception, run, widget
from tests.app.passes import PassCounter
from tformer_app import models, vision_flow
from tformer_core.flow import flow_rollout, information_flow
from tformer_core.trace import lean
from tformer_views import samples
from tformer_views import vision as vv
from tformer_views.flow import HELD_PLACES

SAMPLE = "shapes: ring"
BARS = "Where the class token's information sits, layer by layer"


def bars(at) -> pd.DataFrame:
    return charts(at)[BARS][0]


def test_the_class_tokens_routes_are_the_cores_and_cost_one_pass_once():
    at = run("vision", timeout=120, model="vit-tiny", sample=SAMPLE)
    no_exception(at)
    assert [e.label for e in at.expander if e.label == vision_flow.TITLE] == [vision_flow.TITLE]
    assert BARS not in charts(at)  # folded: a picture costs the page no pass of the flow's
    with PassCounter(models.cached_model("vit-tiny")) as counter:
        at.toggle(key="vit.cls_flow").set_value(True).run()
        no_exception(at)
        assert counter.count == 1  # the flow's own pass: the residual stream after attention is not in the page's

    # The same picture traced here, its flow and rollout computed by the core directly.
    model = tc.load_model("vit-tiny", device="cpu")
    trace = vv.trace_picture(model, samples.samples()[SAMPLE], SAMPLE, keep=lean)
    flow = information_flow(model, trace)
    held = flow_rollout(flow)
    frame = bars(at)
    L = trace.n_layers
    assert sorted(set(frame["before"])) == list(range(L + 1)) and set(frame["where"]) == set(HELD_PLACES)
    by = frame.set_index(["before", "where"])["share"]
    for layer in range(L + 1):
        level = held[2 * layer]
        assert abs(by[(layer, "class token")] - level[0]) < 1e-6
        assert abs(by[(layer, "patches")] - level[1:].sum()) < 1e-6
        assert abs(by[(layer, "taken by biases")] - (1 - level.sum())) < 1e-6
    assert by[(L, "class token")] == 1.0 and by[(0, "patches")] > 0.0
    assert (frame.groupby("before")["share"].sum() - 1).abs().max() < 1e-9  # the four places make the whole

    # The edges into the class token that carry the most of its output, with their heads (vit-tiny is small enough
    # to split): what the stream after layer l's attention holds, times the edge's share, over every (layer, source).
    table = next(d.value for d in at.dataframe if d.value.index.name == "layer").reset_index()
    assert list(table.columns) == ["layer", "head", "from", "share", "carried"]
    n = len(flow.tokens)
    carried = {(lay, j): held[2 * lay + 1, 0] * flow.attention.blocks[lay, 0, j] for lay in range(L) for j in range(n)}
    top = sorted(carried, key=lambda lj: -carried[lj])[:10]
    assert len(table) == 10 and list(zip(table["layer"], table["from"], table["head"], strict=True)) == [
        (lay, flow.tokens[j], flow.top_head[lay, 0, j]) for lay, j in top
    ]
    np.testing.assert_allclose(table["carried"], [round(carried[lj], 4) for lj in top])
    np.testing.assert_allclose(table["share"], [round(flow.attention.blocks[lay, 0, j], 3) for lay, j in top])
    assert any(m.startswith("Before layer 0:") and "the patches together" in m for m in captions(at))

    with PassCounter(models.cached_model("vit-tiny")) as counter:
        widget(at, "vit.cls_flow_before").set_value(L).run()
        no_exception(at)
        assert counter.count == 0  # the slider reads the cached flow
    assert at.query_params["cls_flow_before"] == str(L) and at.query_params["cls_flow"] == "1"
    said = [m for m in captions(at) if m.startswith(f"Before layer {L}:")]
    assert said and "the patches together 0.0%" in said[0]  # at the output it is all the class token's


def captions(at) -> list[str]:
    """The pictures' captions."""
    return [i.proto.imgs[0].caption for i in at.get("image")]


def test_a_flow_the_server_refuses_is_said_on_the_page_and_the_page_keeps_working(monkeypatch, caplog):
    def refused(model, data, name):
        raise tc.InputError("this picture's flow is larger than the server allows")

    monkeypatch.setattr(vision_flow, "_picture_flow", refused)
    at = run("vision", timeout=120, model="vit-tiny", sample="shapes: triangle", cls_flow="1")
    no_exception(at)
    assert [e.value for e in at.error] == [f"{vision_flow.TITLE}: this picture's flow is larger than the server allows"]
    assert BARS not in charts(at) and "What the model sees: top 5" in [s.value for s in at.subheader]
    assert any("larger than the server allows" in r.getMessage() for r in caplog.records)  # logged with its cause


def test_the_part_of_the_page_holds_no_picture(monkeypatch):
    """The section is a part that runs alone (page.part): what it holds lives as long as its session, a closed tab's
    too (two minutes, to be resumed). Holding the picture kept a copy of every photo a class uploaded beyond the
    budget (benchmarks/memory.py: +197 MB after 40 photos); it holds the model's name and reads the picture when
    it runs."""
    held: list = []
    monkeypatch.setattr(vision_flow, "part", lambda url, draw: held.append(draw))
    at = run("vision", timeout=120, model="vit-tiny", sample=SAMPLE)
    no_exception(at)
    assert len(held) == 1
    seen, todo, big = set(), [(held[0], 0)], []
    while todo:  # everything the part's callable reaches, a few references deep (not modules, classes, functions)
        obj, depth = todo.pop()
        if id(obj) in seen or depth > 4 or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview)) and len(obj) > 1000:
            big.append(len(obj))
        todo += [(r, depth + 1) for r in gc.get_referents(obj)]
    assert not big and samples.samples()[SAMPLE]  # the sample's bytes exist; the part does not hold them
