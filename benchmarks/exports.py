"""The head view's SVG and PNG exports (issue 13, defect 8: the PNG took 24-31 s, the SVG 0.7 s).

    python benchmarks/exports.py [--repeats 3] [--with-old-large]

Head views of MiniLM (12 heads, every head drawn, as the page's default and presenter mode show them) at
layer 2: the lecture's sentence (16 tokens), in presenter mode (scale 1.5), and a six-sentence input
(86 tokens, the 6,000-line cap). Times, in the same run:

- SVG: export.to_svg (the SVG button);
- PNG before: vl-convert's vegalite_to_png (export.to_png) on the spec as it was, each line's weight as
  its `opacity` (resvg draws each such element through a layer the size of the picture);
- PNG, resvg: the same on today's spec (the weight as `strokeOpacity`): resvg alone;
- PNG, ours: raster.chart_png (the PNG button): resvg for everything but the lines, the lines in numpy.

The "before" PNG of the 86-token view takes minutes (7.5 min measured): it is run only with
--with-old-large. Ratios: ours / before (and / resvg alone). Timings are medians of --repeats (the slow
baselines once); the machine's load average is printed with them.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image

import tformer_core as tc
from tformer_views import text as tv
from tformer_views.charts.attention import head_view_chart
from tformer_views.charts.export import to_png, to_svg
from tformer_views.charts.raster import chart_png


def with_opacity(spec: dict) -> dict:
    """The head view's spec as it was before: the weight as each line's opacity."""
    old = copy.deepcopy({k: v for k, v in spec.items() if k != "datasets"}) | {"datasets": spec["datasets"]}
    encoding = old["layer"][0]["encoding"]
    encoding["opacity"] = encoding.pop("strokeOpacity")
    return old


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--with-old-large", action="store_true")
    args = parser.parse_args()
    model = tc.load_model("minilm", device="cpu")
    cases = [
        ("lecture sentence, 12 heads", tv.DEFAULT_SENTENCE, 1.0, True),
        ("same, presenter mode (x1.5)", tv.DEFAULT_SENTENCE, 1.5, True),
        ("6 sentences, 12 heads", " ".join([tv.DEFAULT_SENTENCE] * 6), 1.0, args.with_old_large),
    ]
    to_svg(head_view_chart(tv.head_view(model.trace("warm up"), 0, [0]), 12))  # vl-convert's first start
    print(f"MiniLM head view, layer 2, PNG at scale 2 (cpu count {os.cpu_count()}).\n")
    header = (
        f"| {'head view':<28} | lines | tokens | {'SVG':>7} | {'PNG before':>10} | {'PNG resvg':>9} "
        f"| {'PNG ours':>8} | ours/before | ours/resvg | {'PNG size':>11} | load             |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for name, text, scale, run_old in cases:
        trace = model.trace(tc.fit_to_model(model, text).text)
        view = tv.head_view(trace, 2, list(range(trace.n_heads)))
        spec = head_view_chart(view, trace.n_heads, title="layer 2: queries (left) → keys (right)", scale=scale)
        svg_s, _ = median_time(lambda spec=spec: to_svg(spec), args.repeats)
        ours_s, png = median_time(lambda spec=spec: chart_png(spec), args.repeats)
        resvg_s, _ = median_time(lambda spec=spec: to_png(spec), 1)
        old_s = median_time(lambda spec=spec: to_png(with_opacity(spec)), 1)[0] if run_old else float("nan")
        size = "{} x {}".format(*Image.open(io.BytesIO(png)).size)
        before = f"{old_s:9.2f}s" if run_old else "   (skip)"
        ratio = f"{ours_s / old_s:11.3f}" if run_old else "           "
        print(
            f"| {name:<28} | {len(view.lines):5d} | {len(view.queries):6d} | {svg_s:6.2f}s | {before} "
            f"| {resvg_s:8.2f}s | {ours_s:7.2f}s | {ratio} | {ours_s / resvg_s:10.2f} | {size:>11} | {load()} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
