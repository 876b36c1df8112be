"""The README's notebook tour and docs/quickstart.py, its notebook, run as written and compute what they say: the head
that links "it" to "animal", its head view, the ablation of a head of SmolLM2 and the logit lens (offline, on the
CPU). Each test runs on both: they name their results alike."""

import contextlib
import io
import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tformer_core.capture import Edit, Hook
from tformer_views import notebook
from tformer_views.head_matters import lens_frame

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.py"


def readme_tour() -> str:
    """The Python block under the README's `<!-- notebook-tour -->`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("<!-- notebook-tour -->\n```python\n", 1)[1].split("\n```", 1)[0]


@pytest.fixture(scope="module", params=["README.md", "docs/quickstart.py"])
def ran(request):
    """The variables after a run of the README's tour or of the quickstart (as plain Python), and the lines printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        if request.param == "README.md":
            scope: dict = {}
            exec(compile(readme_tour(), str(ROOT / "README.md"), "exec"), scope)
        else:
            scope = runpy.run_path(str(QUICKSTART), run_name="__main__")
    return request.param, scope, printed.getvalue().splitlines()


def test_it_finds_the_head_that_links_it_to_animal(ran):
    _, scope, _ = ran
    trace = scope["trace"]
    it, animal = scope["it"], scope["animal"]
    # Every head's weight from "it" to "animal", read one head at a time through the core (not through the view
    # the quickstart used): the strongest is the lecture's head, layer 3, head 1, 0.68.
    grid = np.array([[trace.attention(l, h)[it, animal] for h in range(trace.n_heads)] for l in range(trace.n_layers)])
    assert np.unravel_index(np.argmax(grid), grid.shape) == (scope["layer"], scope["head"]) == (3, 1)
    assert scope["weight"] == pytest.approx(grid[3, 1], rel=1e-6) and grid[3, 1] == pytest.approx(0.68, abs=0.005)


def test_its_head_view_draws_that_head_inline(ran):
    _, scope, _ = ran
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
    _, scope, _ = ran
    before, after = scope["before"], scope["after"]
    assert before[0][0] == after[0][0] == "ĠParis"
    assert before[0][1] == pytest.approx(0.7725, abs=0.002) and after[0][1] == pytest.approx(0.141, abs=0.002)
    # The same ablation written by hand, at the hook point itself: head 4's output z (before W_O) set to zero.
    llm, prompt = scope["llm"], scope["prompt"]

    seen = []

    def zero_head_4(z: torch.Tensor, hook: Hook) -> torch.Tensor:  # (batch, heads, tokens, d_head)
        seen.append(hook)
        z = z.clone()
        z[:, 4] = 0
        return z

    by_hand = llm.trace(prompt, edits=[Edit("decoder.23.attn.z", zero_head_4)]).predictions(k=3)
    assert seen == [Hook("decoder.23.attn.z", "decoder", 23)]
    assert [token for token, _ in by_hand] == [token for token, _ in after]
    np.testing.assert_allclose([p for _, p in by_hand], [p for _, p in after], rtol=1e-5)


def test_the_logit_lens_finds_paris_only_in_the_last_layers(ran):
    _, scope, _ = ran
    lens, before = scope["lens"], scope["before"]
    assert lens.layers == ("embed", *map(str, range(30)))
    assert lens.target_label == "ĠParis"
    # The last row is the model's own prediction, read through its final norm and unembedding from the residual
    # stream rather than from the head's logits: the same probability, up to float32 rounding. The lens sends one
    # position through the unembedding, the model the whole sequence: the two matmuls' kernels sum in different
    # orders, by a CPU-dependent amount (1.0e-5 relative on one Xeon, less on CI's).
    assert lens.prob[-1] == pytest.approx(before[0][1], rel=1e-4) and lens.top_labels[-1][0] == "ĠParis"
    assert lens.rank[-4:].tolist() == [33, 6, 2, 0]
    assert lens.rank[:23].min() > 1000  # nowhere near the top after the embedding and layers 0 to 21
    table = lens_frame(lens)  # what the quickstart's last cell draws
    assert table["rank of ␣Paris"].tolist() == lens.rank.tolist() and len(table) == 31


def test_the_quickstart_prints_what_it_found_and_the_readme_block_prints_nothing(ran):
    source, scope, printed = ran
    if source == "README.md":
        assert printed == []
        return
    ranks = scope["lens"].rank[-8:].tolist()
    assert printed == [
        'MiniLM, layer 3, head 1: "it" gives "animal" 0.68 of its attention',
        "before: ␣Paris 0.77, ␣the 0.06, ␣London 0.01",
        "head 23.4 ablated: ␣Paris 0.14, ␣the 0.12, ␣London 0.11",
        f"rank of ' Paris' after layers 22 to 29: {ranks}",
    ]
    assert ranks[-4:] == [33, 6, 2, 0]
