"""benchmarks/gpu/run.sh --dry-run: the GPU check (issue 33) on the CPU, tiny, every part through the same code as on
a GPU machine, so the script keeps working while no GPU is lent. One run (about a minute on 2 cores) writes the
table and the JSON; the tests read both. Its figures say nothing about speed: only that each part measured."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deploy.serve import find_nginx

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # one dry run of the whole check: a minute on 2 cores
PARTS = ["environment", "vs_transformers", "half_precision", "vision", "capture_overhead", "load", "tests"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OUT": str(out), "TFORMER_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    return report, (out / "gpu_check.md").read_text(), (out / "gpu_check.log").read_text()


def lines(report: dict, part: str) -> list[dict]:
    return [line["values"] for line in report["lines"] if line["values"] and line["part"] == part]


def positive(*values: float) -> bool:
    return all(isinstance(v, float | int) and math.isfinite(v) and v > 0 for v in values)


def test_every_part_ran_and_has_its_rows_in_the_table(dry_run):
    report, table, log = dry_run
    assert report["dry_run"] and list(report["parts"]) == PARTS
    for name, part in report["parts"].items():
        if name == "load" and find_nginx() is None:
            assert part["status"] == "skipped" and "nginx" in part["note"]
            continue
        assert part["status"] == "ok", f"{name}: {part['note']}\n{log[-3000:]}"
    assert table.startswith("# GPU check (dry run on the CPU")
    figures = table.split("| part | status |")[0]  # the second table lists the parts' statuses
    rows = [line for line in figures.splitlines() if line.startswith("| ") and not line.startswith("| measure")]
    for words in (
        "traced forward / transformers eager with attentions",
        "bfloat16 / float32 speed",
        "bfloat16 logits vs transformers bfloat16",
        "bfloat16 attention vs transformers bfloat16",
        "mean attention distance",
        "traced / plain forward",
        "tests/core/test_attention_steps.py, TFORMER_DEVICE=cpu",
        *(["students, 1 replica(s) on the CPU: open page"] if find_nginx() else []),
    ):
        assert any(words in row for row in rows), words
    assert all(row.count(" | ") >= 5 for row in rows)  # measure, ours, baseline, ratio, goal, verdict


def test_the_speed_rows_are_real_timings_of_every_model_in_both_dtypes(dry_run):
    report = dry_run[0]
    rows = lines(report, "vs_transformers")
    timed = [r for r in rows if "ratio" in r]
    assert {(r["model"].split(",")[0], r["dtype"]) for r in timed} == {
        (m, d) for m in ("BERT", "ViT", "Llama-style", "SmolLM2-style") for d in ("float32", "bfloat16")
    }
    assert {r["input"] for r in timed if r["model"].startswith("BERT")} == {"16 tokens", "32 tokens"}
    for r in timed:
        assert positive(r["ours_s"], r["theirs_s"], r["ratio"]) and r["ratio"] == r["ours_s"] / r["theirs_s"]
        assert r["ours_peak_mb"] is None  # peak GPU memory: on a GPU only
    (speedup,) = [r for r in rows if "speedup" in r]
    assert positive(speedup["speedup"]) and speedup["speedup"] == speedup["float32_s"] / speedup["bfloat16_s"]
    for r in lines(report, "capture_overhead"):
        assert positive(r["ours_s"], r["theirs_s"], r["ratio"], r["trace_mb"])


def test_half_precision_differences_are_within_bfloat16s_bound(dry_run):
    rows = lines(dry_run[0], "half_precision")
    assert {r["model"] for r in rows} == {"Llama-style, tiny (random)", "SmolLM2-style, tiny (random)"}
    eps = torch.finfo(torch.bfloat16).eps
    for r in rows:
        for what in ("logits", "attention"):
            assert 0 <= r[f"{what}_max_diff"] <= r[f"{what}_bound"], (r["model"], what)
            assert r[f"{what}_bound"] >= 4 * eps  # 4 roundings at the reference's largest magnitude, at least 1
        assert r["within"] and 1 / 24 < r["attention_row_max_mean"] <= 1  # rows of 24-32 tokens, sharpened


def test_mean_attention_distance_agrees_with_transformers_in_both_dtypes(dry_run):
    rows = lines(dry_run[0], "vision")
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    for r in rows:
        assert r["pictures"] == 8 and positive(r["ours_s"], r["theirs_s"], r["ratio"])
        assert r["max_diff_px"] < 1e-3  # the same weights, the same attention: pixels agree


def test_the_load_and_the_test_run_report_their_figures(dry_run):
    report = dry_run[0]
    if find_nginx() is not None:
        actions = [r for r in lines(report, "load") if "action" in r]
        # What the students reach in 12 s depends on the machine's load: the first page at least, and no error.
        assert {"open page", "all"} <= {a["action"] for a in actions}
        for a in actions:
            assert a["errors"] == 0 and positive(a["p50_s"], a["p95_s"]) and a["p50_s"] <= a["p95_s"] <= a["max_s"]
        (server,) = [r for r in lines(report, "load") if "replica_rss_peak_mb" in r]
        assert len(server["replica_rss_peak_mb"]) == 1 and server["replica_rss_peak_mb"][0] > 100
        assert server["gpu_utilisation_mean"] is None  # no nvidia-smi in a dry run
        # Before the students, the one replica opened both pages on the load's models (deploy's warm-up).
        (warm,) = [r["warmed"] for r in lines(report, "load") if "warmed" in r]
        assert [(w["page"].split("?")[0], w["ok"]) for w in warm] == [("/text", True), ("/vision", True)]
        assert all("model=" in w["page"] and w["seconds"] > 0 for w in warm)
    (tests,) = lines(report, "tests")
    assert tests["finished"] and tests["counts"]["passed"] > 0
    assert tests["counts"]["failed"] == tests["counts"]["error"] == 0 and tests["skipped_absent"] == []
