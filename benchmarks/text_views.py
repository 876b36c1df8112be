"""Text attention page: what the overview sends to the browser, and what a layer/head switch costs.

    python benchmarks/text_views.py [--tokens 512] [--repeats 5] [--device cpu]

Model: a BERT-base-sized encoder (12 layers x 12 heads, d_model 768) with random weights (speed
and sizes do not depend on the values), one input of --tokens random token ids.

1. The layers x heads overview: our PNG (thumbnails <= 64 px, block-averaged) against the
   baseline a BertViz-style model view sends, the attention weights as JSON
   (json.dumps(weights.tolist()), float32 values as Python floats), measured in the same run for
   the first 6 and all 12 layers; and the raw float32 tensor. Build times of both.
2. Switching layer and head with the same input: the page's view-building functions (head view,
   heatmap, Q/K/V, why-this-weight, distance and overview charts, as the Vega-Lite JSON and Arrow
   data the page sends) from the cached trace, against one traced forward pass; the number of
   forward passes run during the switches is counted (it must be 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# The Arrow conversion Streamlit applies to a chart's datasets (st.vega_lite_chart, as downloads.chart calls it).
from streamlit.dataframe_util import convert_anything_to_arrow_bytes
from timing import interleaved_medians, print_table

import tformer_core as tc
from tests.app.passes import PassCounter
from tformer_views import distance
from tformer_views import overview as ov
from tformer_views import text as tv
from tformer_views import tokens as tok
from tformer_views.charts import attention as attention_charts
from tformer_views.charts import pickers
from tformer_views.charts.spec import heatmap
from tformer_views.why import why_this_weight

BUDGET_BYTES = 3 * 2**20
BUDGET_SECONDS = 1.0


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def first_layers(trace: tc.Trace, n_layers: int) -> tc.Trace:
    """The same trace cut to its first n layers (for the 6 x 12 comparison)."""
    keep = {
        k: v
        for k, v in trace.activations.items()
        if not k.startswith("encoder.") or not k.split(".")[1].isdigit() or int(k.split(".")[1]) < n_layers
    }
    return tc.Trace(
        kind=trace.kind,
        activations=keep,
        tokens=trace.tokens,
        n_heads=trace.n_heads,
        stack_layers={"encoder": n_layers},
        meta=trace.meta,
    )


def noisy_trace(n_layers: int, n_heads: int, n: int) -> tc.Trace:
    """Random sharp attention patterns (rows of noise**4, normalised): the hardest case for PNG compression."""
    rng = np.random.default_rng(0)
    acts = {}
    for layer in range(n_layers):
        w = rng.random((n_heads, n, n), dtype=np.float32) ** 4
        acts[f"encoder.{layer}.attn.weights"] = w / w.sum(-1, keepdims=True)
    return tc.Trace(
        kind="encoder",
        activations=acts,
        tokens=tuple(map(str, range(n))),
        n_heads=n_heads,
        stack_layers={"encoder": n_layers},
    )


def bertviz_json(trace: tc.Trace) -> tuple[int, float]:
    """(bytes, seconds) of the attention of every layer as JSON, as a BertViz-style view embeds it."""
    start = time.perf_counter()
    size = 2  # the surrounding brackets
    for layer in range(trace.n_layers):
        size += len(json.dumps(trace.attention(layer).tolist())) + (1 if layer else 0)  # [heads][n][n] per layer
    return size, time.perf_counter() - start


def sent_bytes(chart) -> int:
    """Bytes the page sends for a chart (as downloads.chart does): its Vega-Lite spec as JSON, its data as Arrow."""
    spec = dict(chart)
    datasets = spec.pop("datasets", {}) or {}
    data = sum(len(convert_anything_to_arrow_bytes(d)) for d in datasets.values())
    return len(json.dumps(spec)) + data


def page_views(trace: tc.Trace, layer: int, head: int, query: int, derived: dict) -> int:
    """What the page builds after a layer/head change (all views on); returns the bytes of chart data sent.

    `derived` stands for the app's cache of what is derived once per input (the overview, the distance
    grid): empty, they are built; filled, they are read. The CSV files of the download buttons are not
    built: they are written only when clicked.
    """
    n = len(trace.tokens)
    shown = tok.visible_positions(trace.tokens, False)
    window = tok.token_window(len(shown), 0)
    specs = []
    view = tv.head_view(trace, layer, range(trace.n_heads), window=window)
    specs.append(attention_charts.head_view_chart(view, trace.n_heads))
    m = tv.head_matrix(trace, layer, head, window=window)
    specs.append(heatmap(m.weights, m.query_labels, m.key_labels, masked=m.masked))
    for matrix, rows, cols in tv.qkv(trace, layer, head, positions=shown[window]).values():
        specs.append(heatmap(matrix, rows, cols, diverging=True, annotate=False, cell_width=5))
    why_this_weight(trace, layer, head, min(query, n - 1)).table()
    if not derived:
        derived["overview"] = ov.overview(trace)
        derived["distances"] = distance.token_distances(trace)
        derived["baseline"] = distance.uniform_token_distance(trace)
    grid = derived["distances"]
    specs.append(pickers.head_grid_chart(grid, (layer, head)))
    specs.append(attention_charts.distance_chart(grid, derived["baseline"], trace.n_heads, (layer, head)))
    assert derived["overview"].png  # built once per input (then cached), so not counted per switch
    return sum(sent_bytes(s) for s in specs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu: the page's server)")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = tc.Encoder(
        tc.EncoderConfig(
            vocab_size=30522,
            max_positions=512,
            n_layers=12,
            d_model=768,
            n_heads=12,
            d_ff=3072,
            n_token_types=2,
            ln_eps=1e-12,
        )
    ).place(device)
    ids = torch.randint(1000, 30522, (args.tokens,)).tolist()
    trace = model.trace(ids)

    # ---- 1. the overview picture against the weights as JSON ----
    t_png, picture = median_time(lambda: ov.overview(trace), args.repeats)
    half = first_layers(trace, 6)
    t_png6, picture6 = median_time(lambda: ov.overview(half), args.repeats)
    noisy = noisy_trace(12, 12, args.tokens)
    worst_png = ov.overview(noisy).png
    real_png = None
    try:
        minilm = tc.load_model("minilm", device=device)
        text = tc.fit_to_model(minilm, " ".join([tv.DEFAULT_SENTENCE] * 40)).text  # cut to 512 tokens
        real_png = ov.overview(minilm.trace(text)).png
    except (tc.CheckpointError, ValueError) as error:  # the bundled package is missing
        print(f"(MiniLM row skipped: {error})")
    json12, t_json12 = bertviz_json(trace)
    json6, t_json6 = bertviz_json(half)
    raw12 = sum(trace.attention(layer).nbytes for layer in range(12))

    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    print(
        f"Text attention views on {device.type.upper()} (torch {torch.__version__}, CPU threads {threads}); "
        f"BERT-base-sized encoder, {args.tokens} tokens; medians of {args.repeats}.\n"
    )
    print("1. Overview of every layer x head: bytes sent to the browser")
    header = f"| {'what':<34} | {'ours (PNG)':>12} | {'baseline':>14} | {'baseline is':<34} | {'ratio':>8} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    rows = [
        ("6 x 12 heads (BertViz's example)", len(picture6.png), json6, "weights as JSON"),
        ("12 x 12 heads", len(picture.png), json12, "weights as JSON"),
        ("12 x 12 heads", len(picture.png), raw12, "raw float32 tensor"),
        ("12 x 12, random sharp patterns", len(worst_png), json12, "weights as JSON (12 x 12 above)"),
    ]
    if real_png is not None:
        rows.append(("MiniLM, real weights, 6 x 12", len(real_png), json6, "weights as JSON (6 x 12 above)"))
    for what, ours, base, label in rows:
        mb = f"{ours / 2**20:>9.3f} MB | {base / 2**20:>11.1f} MB"
        print(f"| {what:<34} | {mb} | {label:<34} | {ours / base:>8.1e} |")
    worst = max(r[1] for r in rows)
    flag = "within" if worst <= BUDGET_BYTES and t_png <= BUDGET_SECONDS else "OVER"
    print("Random weights give near-uniform attention, which compresses well; random patterns are the worst case.")
    print(
        f"PNG {len(picture.png):,} bytes (largest above {worst:,}), "
        f"thumbnails {picture.cell_px[0]} x {picture.cell_px[1]} px "
        f"({picture.block} x {picture.block} token pairs per pixel); budget 3 MB and 1 s: {flag}.\n"
    )

    print("2. Build times")
    layer_heads = [((3 * i) % 12, (5 * i + 1) % 12) for i in range(args.repeats + 2)]
    cycle = iter(layer_heads * 1000)
    cached: dict = {}

    def switch(derived: dict = cached) -> int:
        layer, head = next(cycle)
        return page_views(trace, layer, head, query=args.tokens // 2, derived=derived)

    with PassCounter(model) as counter:
        payload = switch()
        t_switch, _ = median_time(switch, args.repeats)
        t_cold, _ = median_time(lambda: switch({}), args.repeats)
        switch_passes = counter.count
    t_switch, t_forward = interleaved_medians(switch, lambda: model.trace(ids), args.repeats, device)
    print_table(
        [
            ("overview PNG, 12 x 12", f"{args.tokens} tokens", t_png, t_json12),
            ("overview PNG, 6 x 12", f"{args.tokens} tokens", t_png6, t_json6),
            ("layer/head switch", "cached trace", t_switch, t_forward),
            ("switch + overview rebuilt", "cached trace", t_cold, t_forward),
        ],
        "ours",
        "baseline",
        goal=1.0,
    )
    print("Baselines: rows 1-2, json.dumps of the weights (BertViz-style); rows 3-4, one traced forward pass.")
    print("Row 3: every view of the page for a new layer/head (head view, heatmap, Q/K/V, why-this-weight,")
    print("distance and grid charts, as the page sends them). Row 4: row 3 with the overview and distance grid")
    print("rebuilt (first view of an input; afterwards the app's cache holds them). The whole page rerun,")
    print("Streamlit included, is measured by benchmarks/text_page.py.")
    print(
        f"Forward passes run by the layer/head switches: {switch_passes} (must be 0). "
        f"Chart data sent per switch: {payload / 2**10:.0f} KB (spec JSON + Arrow; 64-token window in detail views)."
    )


if __name__ == "__main__":
    main()
