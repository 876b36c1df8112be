"""docs/quickstart.py, the notebook of the README's tour, runs top to bottom and computes what it says: the head that
links "it" to "animal", its head view, the ablation of a head of SmolLM2 and the logit lens (offline, on the CPU)."""

import contextlib
import io
import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tformer_core.capture import Edit, intervene
from tformer_views import notebook

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.py"


@pytest.fixture(scope="module")
def ran():
    """The quickstart's variables after a run as plain Python, and the lines it printed (its output as a script)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        scope = runpy.run_path(str(QUICKSTART), run_name="__main__")
    return scope, printed.getvalue().splitlines()


def test_it_finds_the_head_that_links_it_to_animal(ran):
    scope, printed = ran
    trace = scope["trace"]
    it, animal = scope["it"], scope["animal"]
    # Every head's weight from "it" to "animal", read one head at a time through the core (not through the view
    # the quickstart used): the strongest is the lecture's head, layer 3, head 1, 0.68.
    grid = np.array([[trace.attention(l, h)[it, animal] for h in range(trace.n_heads)] for l in range(trace.n_layers)])
    assert np.unravel_index(np.argmax(grid), grid.shape) == (scope["layer"], scope["head"]) == (3, 1)
    assert scope["weight"] == pytest.approx(grid[3, 1], rel=1e-6) and grid[3, 1] == pytest.approx(0.68, abs=0.005)
    assert printed[0] == 'MiniLM, layer 3, head 1: "it" gives "animal" 0.68 of its attention'


def test_its_head_view_draws_that_head_inline(ran):
    scope, _ = ran
    view = scope["view"]
    assert isinstance(view, notebook.Chart)
    bundle = view._repr_mimebundle_()
    spec = bundle[notebook.VEGA_LITE_MIME]
    lines = pd.DataFrame(spec["datasets"][spec["layer"][0]["data"]["name"]])
    assert set(lines["head"]) == {1}
    it, animal = scope["it"], scope["animal"]
    (line,) = lines[(lines["query"] == it) & (lines["y_key"] == animal)]["weight"]
    assert line == pytest.approx(scope["weight"], rel=1e-6)
    assert "query: it; key: animal" in bundle["image/svg+xml"]


def test_ablating_head_23_4_takes_most_of_paris_away(ran):
    scope, printed = ran
    before, after = scope["before"], scope["after"]
    assert before[0][0] == after[0][0] == "ĠParis"
    assert before[0][1] == pytest.approx(0.7725, abs=0.002) and after[0][1] == pytest.approx(0.141, abs=0.002)
    # The same ablation written by hand, at the hook point itself: head 4's output z (before W_O) set to zero.
    llm, prompt = scope["llm"], scope["prompt"]

    def zero_head_4(z: torch.Tensor) -> torch.Tensor:  # (batch, heads, tokens, d_head)
        z = z.clone()
        z[:, 4] = 0
        return z

    with intervene([Edit("decoder.23.attn.z", zero_head_4)]):
        by_hand = llm.trace(prompt).predictions(k=3)
    assert [token for token, _ in by_hand] == [token for token, _ in after]
    np.testing.assert_allclose([p for _, p in by_hand], [p for _, p in after], rtol=1e-5)
    assert printed[1:3] == [
        "before: ␣Paris 0.77, ␣the 0.06, ␣London 0.01",
        "head 23.4 ablated: ␣Paris 0.14, ␣the 0.12, ␣London 0.11",
    ]


def test_the_logit_lens_finds_paris_only_in_the_last_layers(ran):
    scope, printed = ran
    lens, before = scope["lens"], scope["before"]
    assert lens.layers == ("embed", *map(str, range(30)))
    assert lens.target_label == "ĠParis"
    # The last row is the model's own prediction, read through its final norm and unembedding from the residual
    # stream rather than from the head's logits: the same probability.
    assert lens.prob[-1] == pytest.approx(before[0][1], rel=1e-5) and lens.top_labels[-1][0] == "ĠParis"
    assert lens.rank[-4:].tolist() == [33, 6, 2, 0]
    assert lens.rank[:23].min() > 1000  # nowhere near the top after the embedding and layers 0 to 21
    table = scope["lens_frame"](lens)
    assert table["rank of ␣Paris"].tolist() == lens.rank.tolist() and len(table) == 31
    assert printed[3].startswith("rank of ' Paris' after layers 22 to 29: [") and printed[3].endswith(", 33, 6, 2, 0]")
