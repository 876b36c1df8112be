"""Pages stay thin: read widgets, ask the views, draw. A page file past 300 lines is doing more than that; move a
coherent piece of its drawing into a tformer_app module (as real_positions.py, translation_steps.py)."""

from pathlib import Path

PAGES = Path(__file__).resolve().parents[2] / "app_pages"
MAX_PAGE_LINES = 300


def test_every_page_file_is_at_most_300_lines():
    pages = sorted(PAGES.glob("*.py"))
    assert len(pages) >= 15, f"the pages were not found in {PAGES}: {pages}"  # a glob of nothing would pass
    lengths = {path.name: len(path.read_text().splitlines()) for path in pages}
    too_long = [f"app_pages/{name} has {n} lines" for name, n in lengths.items() if n > MAX_PAGE_LINES]
    assert not too_long, f"a page file may have at most {MAX_PAGE_LINES} lines: {too_long}"
