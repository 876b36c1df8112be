"""The Encoder-decoder page: server time of a step or head change, and what the first view costs.

    python benchmarks/seq2seq_page.py [--repeats 7]

Two models, opened by the page as a user would:
- translator: the bundled toy translator (2 + 2 layers, 4 heads, d_model 128), default sentence;
- t5-small-sized: a random T5 with t5-small's sizes (6 + 6 layers, 8 heads, d_model 512, d_ff 2048)
  and a small BPE tokenizer trained here, saved as a local folder; a 48-token source, greedy
  decoding for 40 tokens (random weights never write the end token).

Server time is measured with Streamlit's AppTest (script run, element messages, chart data; no
browser). A "view change" moves the step slider and switches the decoder head and the encoder head;
forward passes are counted during them (must be 0). Baseline: the page's first view of a new
input in the same session (the greedy translation: one encoder pass and one decoder pass per
token, every step traced), measured in the same run. Budget (as on the Text attention page): a
view change <= 150 ms and 0 passes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
from streamlit.testing.v1 import AppTest

from tests.app.passes import PassCounter
from tests.core.hf_helpers import save_tiny_t5
from tformer_app import models

PAGE = str(ROOT / "app_pages" / "encoder_decoder.py")
BUDGET_S = 0.150
T5_SMALL = {"d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8}
LONG_SOURCE = " ".join(["translate English to German: The house is wonderful. The cat sat on the mat."] * 3)


def widget(at, key):
    return next(w for w in at.main if getattr(w, "key", None) == key)


def measure(source: str, text: str, max_new: int, repeats: int) -> dict:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.query_params.update({"model": source, "text": text, "max": str(max_new)})
    at.run()  # loads the model (not timed)
    assert not at.exception, [e.value for e in at.exception]
    first = []
    for i in range(3):  # new inputs: the translation is computed (and cached) each time
        at.text_input(key="s2s.text").input(f"{text} {'again ' * (i + 1)}".strip())
        start = time.perf_counter()
        at.run()
        first.append(time.perf_counter() - start)
        assert not at.exception, [e.value for e in at.exception]
    n_steps = int(at.slider(key="s2s.step").max)
    heads = widget(at, "s2s.head").options
    times = []
    with PassCounter(models.cached_model(source)) as counter:
        for i in range(repeats + 1):
            if i % 3 == 0:
                at.slider(key="s2s.step").set_value(1 + (5 * i) % n_steps)
            elif i % 3 == 1:
                widget(at, "s2s.head").set_value(int(heads[(i + 1) % len(heads)]))
            else:
                widget(at, "s2s.enc_head").set_value(int(heads[i % len(heads)]))
            start = time.perf_counter()
            at.run()
            if i:
                times.append(time.perf_counter() - start)
            assert not at.exception, [e.value for e in at.exception]
    return {
        "steps": n_steps,
        "first": statistics.median(first),
        "switch": statistics.median(times),
        "switch_max": max(times),
        "passes": counter.count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("TFORMER_DEVICE", "cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny_t5(Path(tmp) / "t5-small-sized", **T5_SMALL)
        os.environ["TFORMER_MODEL_DIRS"] = tmp
        rows.append(
            ("translator", measure("translator", "the big dog chases a small cat near the river", 40, args.repeats))
        )
        rows.append(("t5-small-sized (random)", measure(str(folder), LONG_SOURCE, 40, args.repeats)))
    print(
        f"Encoder-decoder page, server time (AppTest), CPU, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; "
        f"medians of {args.repeats} view changes (step, decoder head, encoder head).\n"
    )
    print(
        "| model                   | steps | view change (median) | slowest | baseline: first view | ratio | passes |"
    )
    print(
        "|-------------------------|-------|----------------------|---------|----------------------|-------|--------|"
    )
    for name, r in rows:
        print(
            f"| {name:<23} | {r['steps']:>5} | {r['switch'] * 1e3:>17.0f} ms | {r['switch_max'] * 1e3:>4.0f} ms "
            f"| {r['first'] * 1e3:>17.0f} ms | {r['switch'] / r['first']:>5.2f} | {r['passes']:>6} |"
        )
    ok = all(r["switch"] <= BUDGET_S and r["passes"] == 0 for _, r in rows)
    print(f"\nBudget: a view change <= 150 ms with 0 forward passes: {'within' if ok else 'OVER'}.")


if __name__ == "__main__":
    main()
