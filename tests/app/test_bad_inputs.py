"""A corpus of bad inputs, one row per (page, input, what the page must say), driven through the real pages
(AppTest): each must give a message (never a traceback, never "something went wrong on the server"), and the
session must go on (the next run draws without it).

Every row was once a failure on a live server (issue 34) unless it says otherwise. To add one, write a `Case`:
the page (a file of app_pages/), the input in words (the test's id), a fragment of the message, and how it is
given: URL parameters (`params`), a picture uploaded to the page's picture chooser (`upload`), or a crafted
data editor state sent for the editor whose key starts with `edit` (`state`).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from tests.app.pages import messages, models_from, no_exception, run
from tests.core.test_mae_detr import save_tiny_detr
from tests.core.test_pass_memory import save_vit


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def edits(**state: object) -> dict:
    """A data editor's state as the browser sends it (missing parts empty)."""
    return {"edited_rows": {}, "added_rows": [], "deleted_rows": [], **state}


@dataclass(frozen=True)
class Case:
    page: str
    given: str  # the input, in words
    shown: str  # a fragment of the message the page must show
    params: dict[str, str] = field(default_factory=dict)
    upload: bytes | None = None  # uploaded to the page's picture chooser ("<url name>.upload")
    edit: str | None = None  # the key (its start) of the data editor `state` is sent for
    state: object = None
    timeout: float = 180
    slow: bool = False  # seconds of real computation (a study of smollm2): left out of the fast tier


STRIP = "one side is 60,000 times the other, and the models here read pictures whose longer side is at most 20"
NO_ROW_99 = "Edits that did not fit this table were left out: an edit of row '99', which the table does not have."
NO_COLUMN_ZZ = "an edit of the column 'zz', which the table does not have"
LIMIT = "the score functions take finite numbers up to 1e+100 in size"
PASS_LIMIT = "(the setting TFORMER_PASS_MB)"
CASES = [
    # ---- 1. patching two inputs of different lengths: "something went wrong on the server" --------------------
    Case(
        "head_matters",
        "your own pair, A and B of different token counts",
        "A has 5 tokens and B has 7: patching puts B's token at each position into A's at the same position, one to "
        "one, so both inputs need the same number of tokens. A: The | ␣capital | ␣of | ␣France | ␣is. B: The | "
        "␣capital | ␣of | ␣the | ␣United | ␣Kingdom | ␣is.",
        params={
            "model": "smollm2",
            "pair": "your own pair",
            "a": "The capital of France is",
            "b": "The capital of the United Kingdom is",
        },
        timeout=600,
        slow=True,
    ),
    Case(  # longer than a grid the server computes, and unequal: told what no grid could fix first
        "head_matters",
        "your own pair of 18 and 21 tokens",
        "A has 18 tokens and B has 21: patching puts B's token at each position into A's at the same position",
        params={
            "model": "smollm2",
            "pair": "your own pair",
            "a": "<img src=x onerror=alert(1)> **bold** $x$",
            "b": "<img src=x onerror=alert(1)> **bold** $x$ and more words",
        },
        timeout=600,
    ),
    # ---- 2. a 60,000 x 1 or 1 x 60,000 picture on every picture page (DETR: a side resized to 0 px) -------------
    *(
        Case(page, f"a {w} x {h} PNG", f"the picture is {w:,} × {h:,} pixels: {STRIP}", params, png(w, h))
        for page, params in (
            ("vision", {"model": "vit-tiny"}),
            ("mae", {}),
            ("detr", {"model": "models/tiny-detr"}),
            ("inductive_bias", {"model": "vit-tiny"}),
            ("head_matters", {"model": "vit-tiny"}),
        )
        for w, h in ((60_000, 1), (1, 60_000))
    ),
    Case(
        "attention_distance",
        "a 60000 x 1 PNG among the pictures",
        "Left out: strip.png: the picture is 60,000 × 1 pixels",
        upload=png(60_000, 1),
        timeout=300,
    ),
    Case(
        "detr",
        "a 2000 x 100 PNG (20:1) for a DETR reading 160 px at most",
        "its shorter side would be 8 pixels; DETR reads at least 32. Crop it",
        {"model": "models/tiny-detr"},
        png(2_000, 100),
    ),
    # ---- 3. overflowing numbers in the score functions: inf and NaN shown as scores -----------------------------
    Case("before_transformers", "a = 1e200", f"a holds 1e+200 (number 1): {LIMIT}", {"a": "1e200, 1", "b": "3, 4"}),
    Case("before_transformers", "b = 1e308", f"b holds 1e+308 (number 2): {LIMIT}", {"a": "1, 2", "b": "3, 1e308"}),
    Case("before_transformers", "a = Infinity", f"a holds inf (number 2): {LIMIT}", {"a": "1, Infinity"}),
    Case(
        "before_transformers",
        "W = 1e308 in its editor",
        f"W holds 1e+308 (row 1, column 1): {LIMIT}",
        edit="early.W@",
        state=edits(edited_rows={"0": {"0": 1e308}}),
    ),
    # ---- 4. crafted data editor edits: a KeyError traceback and a broken session ------------------------------
    Case(
        "before_transformers",
        'W edited {"99":{"zz":1}}',
        NO_ROW_99,
        edit="early.W@",
        state=edits(edited_rows={"99": {"zz": 1}}),
    ),
    Case(
        "step_by_step",
        'X edited {"99":{"zz":1}}',
        NO_ROW_99,
        edit="step.edit.X.",
        state=edits(edited_rows={"99": {"zz": 1}}),
    ),
    Case(
        "step_by_step",
        'W_q edited {"0":{"zz":1}}',
        NO_COLUMN_ZZ,
        edit="step.edit.W_q.",
        state=edits(edited_rows={"0": {"zz": 1}}),
    ),
    Case(
        "step_by_step",
        "X's row -1 edited (Streamlit edited the last row)",
        "an edit of row '-1', which the table does not have",
        edit="step.edit.X.",
        state=edits(edited_rows={"-1": {"0": 9}}),
    ),
    Case(
        "step_by_step",
        "X given 100,000 rows",
        "100,000 rows added (this table takes at most 256 rows)",
        edit="step.edit.X.",
        state=edits(added_rows=[{}] * 100_000),
    ),
    Case(
        "step_by_step",
        "X's edits not a JSON object",
        "edits that are not a table of changes",
        edit="step.edit.X.",
        state="garbage",
    ),
    Case(
        "inside_block",
        'x edited {"99":{"zz":1}}',
        NO_ROW_99,
        edit="block.ln.X.",
        state=edits(edited_rows={"99": {"zz": 1}}),
        timeout=300,
    ),
    Case(
        "inside_block",
        "γ and β given a row",
        "rows added to or deleted from a table of fixed size",
        edit="block.ln.p.",
        state=edits(added_rows=[{"0": 1}]),
        timeout=300,
    ),
    Case(
        "vision",
        'the patch embedding\'s image edited {"99":{"zz":1}}',
        NO_ROW_99,
        {"model": "vit-tiny", "pe": "1"},
        edit="vit.pe.image.",
        state=edits(edited_rows={"99": {"zz": 1}}),
    ),
    Case(
        "vision",
        "a kernel's cell given a list",
        "a cell given a value that is not a single number or text",
        {"model": "vit-tiny", "pe": "1"},
        edit="vit.pe.kernel0.",
        state=edits(edited_rows={"0": {"0": [1, 2]}}),
    ),
    # ---- 5.-8. what a model's config asks of a pass (TFORMER_PASS_MB) ------------------------------------------
    Case(
        "vision",
        "a ViT made for 1536-pixel pictures",
        "models/vit1536: one pass over a 1,536 x 1,536 picture (9,217 tokens) would take about 1,557 MB of working "
        "memory (one layer's attention alone 324 MB), more than this server gives a pass: the limit is 672 MB "
        + PASS_LIMIT,
        {"model": "models/vit1536"},
    ),
    Case(
        "detr",
        "a DETR made for 4,096 x 8,192-pixel pictures",
        "models/detr8k: one pass over a 8,192 x 4,096 picture (32,768 feature cells) would take about",
        {"model": "models/detr8k"},
    ),
    Case(
        "text_attention",
        "600 words for SmolLM2 (362 tokens a pass)",
        "one pass of this model reads at most 362 on this server (the working memory a pass may take, "
        "TFORMER_PASS_MB; the model up to 8,192)",
        {"model": "smollm2", "arch": "decoder", "views": "heatmap", "text": " ".join(["word"] * 600)},
        timeout=600,
    ),
]


# The name each page gives its widgets' keys (run_page's third argument).
URL_NAMES = {
    "vision": "vit",
    "mae": "mae",
    "detr": "detr",
    "inductive_bias": "shift",
    "head_matters": "heads",
    "attention_distance": "mad",
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """TFORMER_MODEL_DIRS -> models/ with a tiny DETR (pictures of 96 to 160 px), a ViT made for 1536-pixel
    pictures and a DETR made for 4,096 x 8,192-pixel ones (both within TFORMER_MAX_PARAMS)."""
    root = tmp_path_factory.mktemp("srv") / "models"
    save_tiny_detr(root / "tiny-detr")
    save_vit(root / "vit1536", 1536, 16)
    save_tiny_detr(root / "detr8k", stages=4)
    (root / "detr8k" / "preprocessor_config.json").write_text(
        json.dumps({"size": {"shortest_edge": 4096, "longest_edge": 8192}})
    )
    with models_from(root):
        yield root


def editor_key(at: AppTest, start: str) -> str:
    """The one data editor on the page whose key starts with `start` (keys end with a digest of their table)."""
    keys = [k for k in at.session_state._state._state.filtered_state if str(k).startswith(start)]
    assert len(keys) == 1, (start, keys)
    return keys[0]


def shown(at: AppTest) -> list[str]:
    return [m for kind in ("error", "warning", "info") for m in messages(at, kind)]


def check_shown(at: AppTest, case: Case) -> None:
    no_exception(at)
    texts = shown(at)
    assert any(case.shown in t for t in texts), texts
    assert not any("something went wrong" in t or "Traceback" in t for t in texts), texts


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=f"{c.page}: {c.given}", marks=[pytest.mark.slow] if c.slow else []) for c in CASES]
)
def test_a_bad_input_gets_its_message_and_the_session_goes_on(case: Case, model_dirs: Path) -> None:
    at = run(case.page, timeout=case.timeout, **case.params)
    if case.upload is not None:
        name = URL_NAMES[case.page]
        if case.page == "attention_distance":  # several pictures: samples and uploads together
            at.file_uploader(key=f"{name}.uploads").set_value([("strip.png", case.upload, "image/png")]).run()
        else:
            at.radio(key=f"{name}.from").set_value("upload").run()
            at.file_uploader(key=f"{name}.upload").set_value([("strip.png", case.upload, "image/png")]).run()
    if case.edit is not None:
        no_exception(at)
        key = editor_key(at, case.edit)
        at.session_state[key] = case.state
        at.run()
    check_shown(at, case)
    at.run()  # the session goes on: the next run has no exception, and a refused edit is not refused again
    no_exception(at)
    if case.edit is not None:
        assert not any("did not fit this table" in t for t in shown(at)), shown(at)
