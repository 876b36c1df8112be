"""The GPU check (issue 33): the GPU figures the project promises, measured in one call of a GPU machine and written
as one Markdown table (measure, ours, baseline, ratio, goal, verdict) and its raw JSON.

    benchmarks/gpu/run.sh                     # on the GPU machine: installs what travelled in .gpu/, then this
    python benchmarks/gpu/check.py --out DIR [--dry-run] [--budget-s 440] [--only PART,...] [--replicas K]

Parts, in this order, each a process of its own under its own time limit; one that fails or runs over is recorded
(exit status, the end of its output) and the next one runs:

  environment       the GPU (torch.cuda.get_device_name), the driver (nvidia-smi), the versions
  vs_transformers   benchmarks/vs_transformers.py --preset large, float32 and bfloat16: traced forward against
                    transformers' eager forward with attentions, peak GPU memory of each; bfloat16 / float32 speed
  half_precision    benchmarks/half_precision.py: bfloat16 logits and attention against transformers in bfloat16
  vision            benchmarks/vision.py --vit-b-only: mean attention distance over 128 pictures, ViT-B/16, float32
                    and bfloat16
  capture_overhead  benchmarks/capture_overhead.py: traced against plain forward, BERT-base and ViT-B/16 sizes
  load              benchmarks/load.py: 100 simulated students against K replicas (deploy/) sharing the one GPU
  tests             tests/core and tests/views with TFORMER_DEVICE=cuda (pytest-xdist when installed)

The whole stays within --budget-s (counted from TFORMER_GPU_CHECK_STARTED, which run.sh sets, else from now): a
part's limit is its own budget, cut so that the parts after it keep their minimum; a part with less than its
minimum left is skipped and says so. Models: random weights throughout (speed does not depend on the values). The
load's Text attention and Vision Transformer pages open on MiniLM-L6's and DeiT-Tiny's architectures (their
configs and MiniLM's tokenizer, travelled in .gpu/models; weights drawn here), since their weights do not travel
with the rest (benchmarks/gpu/README.md).

--dry-run: the same parts on the CPU, tiny: two-layer models of width 64, 8 pictures, one replica and two students
for a few seconds, one test file; no nvidia-smi, no CUDA. tests/benchmarks/test_gpu_check.py runs it in CI so this
script keeps working while no GPU is lent. Its figures say nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # deploy.serve, tformer_core
CARRIED = ROOT / ".gpu"  # what benchmarks/gpu/bundle.sh gathers and the device call carries
SHARED = ROOT.parent / "shared"
ABSENT_LOG = "TFORMER_GPU_ABSENT_LOG"  # benchmarks/gpu/absent.py appends the tests it turned into skips here
MINILM_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
DEIT_FILES = ("config.json", "preprocessor_config.json")
TEXT_MODEL, VISION_MODEL = "minilm-l6-v2-shape", "deit-tiny-shape"  # folders under the models' folder
LOAD_SESSIONS, LOAD_P95_GOAL_S = 100, 1.0
VERSIONS_OF = ("numpy", "pandas", "pyarrow", "pillow", "streamlit", "huggingface-hub", "tokenizers", "pytest")


@dataclass
class Part:
    name: str
    budget_s: float  # on a GPU machine; its limit
    minimum_s: float  # less than this left: skipped
    dry_budget_s: float = 120.0
    status: str = "not run"  # ok, failed, timeout, skipped
    seconds: float = 0.0
    exit: int | None = None
    data: dict = field(default_factory=dict)
    note: str = ""


PARTS = [
    Part("environment", 30, 5),
    Part("vs_transformers", 150, 60),
    Part("half_precision", 60, 20),
    Part("vision", 70, 25),
    Part("capture_overhead", 35, 15),
    Part("load", 130, 70, dry_budget_s=150),
    Part("tests", 150, 45, dry_budget_s=150),
]


# ---- running a part ------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = args.dry_run
        self.work = args.work
        self.log = (args.out / "gpu_check.log").open("a")
        started = os.environ.get("TFORMER_GPU_CHECK_STARTED")
        self.started = float(started) if started else time.time()
        self.deadline = self.started + args.budget_s
        self.checkpoints = self.work / "checkpoints"  # the large preset's, shared by the parts that use them

    def env(self, **more: str) -> dict[str, str]:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TFORMER_DEVICE": "cpu" if self.dry else "cuda",
            "TFORMER_CACHE_DIR": str(self.work / "cache"),
            "PYTHONUNBUFFERED": "1",
            **more,
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return env

    def run(self, part: Part, command: list[str], limit_s: float, env: dict[str, str] | None = None) -> str:
        """Run `command` from the repository root within limit_s seconds; its output goes to the log and is
        returned. Sets part.exit (None: killed at the limit)."""
        self.log.write(f"\n===== {part.name}: {' '.join(command)} (limit {limit_s:.0f} s)\n")
        self.log.flush()
        with tempfile.TemporaryFile("w+") as output:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env or self.env(),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its group is stopped as a whole at the limit (deploy's replicas too)
            )
            try:
                part.exit = process.wait(limit_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                part.exit = None
            output.seek(0)
            text = output.read()
        self.log.write(text)
        self.log.flush()
        return text

    def python(self, part: Part, script: str, arguments: list[str], limit_s: float, **env: str) -> dict:
        """Run a benchmark script with --json; its figures, or {} (part.status says why)."""
        result = self.work / f"{part.name}.json"
        result.unlink(missing_ok=True)
        text = self.run(part, [sys.executable, script, *arguments, "--json", str(result)], limit_s, self.env(**env))
        judge(part, text, limit_s)
        return json.loads(result.read_text()) if result.is_file() else {}


def judge(part: Part, text: str, limit_s: float) -> None:
    if part.exit is None:
        part.status, part.note = "timeout", f"stopped at its limit of {limit_s:.0f} s"
    elif part.exit != 0:
        part.status = "failed"
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or ["no output"]
        part.note = f"exit {part.exit}: {last[0][:300]}"
    else:
        part.status = "ok"


# ---- the parts -----------------------------------------------------------------------------------------------
def environment(r: Runner, part: Part, limit_s: float) -> None:
    code = (
        "import json, platform, torch, transformers\n"
        "from importlib.metadata import version, PackageNotFoundError\n"
        "def v(name):\n"
        "    try:\n"
        "        return version(name)\n"
        "    except PackageNotFoundError:\n"
        "        return None\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'gpu': torch.cuda.get_device_name(0) if cuda else None,\n"
        "  'gpu_memory_mb': torch.cuda.get_device_properties(0).total_memory / 2**20 if cuda else None,\n"
        "  'cuda': torch.version.cuda, 'torch': torch.__version__, 'transformers': transformers.__version__,\n"
        "  'python': platform.python_version(), 'packages': {n: v(n) for n in PACKAGES}}))\n"
    ).replace("PACKAGES", repr(VERSIONS_OF))
    text = r.run(part, [sys.executable, "-c", code], limit_s)
    judge(part, text, limit_s)
    lines = [line for line in text.splitlines() if line.startswith("{")]
    part.data = json.loads(lines[-1]) if lines else {}
    part.data["cpus"] = os.cpu_count()
    part.data["machine"] = platform.machine()
    smi = None if r.dry else shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        part.data["nvidia_smi"] = out.stdout.strip()
    if not r.dry and not part.data.get("gpu"):
        part.status, part.note = "failed", "torch sees no CUDA device"


def vs_transformers(r: Runner, part: Part, limit_s: float) -> None:
    size = ["--tiny", "--repeats", "1", "--device", "cpu"] if r.dry else ["--repeats", "9", "--device", "cuda"]
    arguments = ["--preset", "large", "--dtype", "float32,bfloat16", "--allocator", "retain", *size]
    part.data = r.python(part, "benchmarks/vs_transformers.py", [*arguments, "--folder", str(r.checkpoints)], limit_s)


def half_precision(r: Runner, part: Part, limit_s: float) -> None:
    size = ["--tiny", "--device", "cpu"] if r.dry else ["--device", "cuda"]
    arguments = [*size, "--dtype", "bfloat16", "--folder", str(r.checkpoints)]
    part.data = r.python(part, "benchmarks/half_precision.py", arguments, limit_s)


def vision(r: Runner, part: Part, limit_s: float) -> None:
    size = ["--tiny", "--pictures", "8", "--device", "cpu"] if r.dry else ["--pictures", "128", "--device", "cuda"]
    arguments = ["--vit-b-only", *size, "--dtype", "float32,bfloat16", "--folder", str(r.checkpoints)]
    part.data = r.python(part, "benchmarks/vision.py", [*arguments, "--images", str(images())], limit_s)


def capture_overhead(r: Runner, part: Part, limit_s: float) -> None:
    size = ["--tiny", "--repeats", "1", "--device", "cpu"] if r.dry else ["--repeats", "9", "--device", "cuda"]
    part.data = r.python(part, "benchmarks/capture_overhead.py", [*size, "--allocator", "retain"], limit_s)


def load(r: Runner, part: Part, limit_s: float) -> None:
    from deploy.serve import find_nginx

    if find_nginx() is None:
        part.status, part.note = "skipped", "nginx is not installed (.gpu/debs holds Debian's; run.sh unpacks it)"
        return
    models = r.work / "models"
    made = make_models(models)
    cores = os.cpu_count() or 1
    if r.dry:  # long enough for a student to reach the Vision Transformer page
        replicas, sessions, duration = 1, 2, 12.0
        extra = ["--think", "0.3", "--ramp", "1", "--timeout", "90"]
    else:
        # One replica per core, less one for this load generator (in a class it runs on the students' laptops).
        replicas, sessions = r.args.replicas or max(1, cores - 1), LOAD_SESSIONS
        duration = max(20.0, min(60.0, limit_s - 60))  # the replicas' start and stop within the rest
        extra = []
    arguments = [
        "--start",
        str(replicas),
        "--sessions",
        str(sessions),
        "--duration",
        f"{duration:g}",
        "--p95-goal",
        str(LOAD_P95_GOAL_S),
        *extra,
    ]
    for flag, name in (("--text-model", TEXT_MODEL), ("--vision-model", VISION_MODEL)):
        if name in made:
            arguments += [flag, f"{models.name}/{name}"]
    part.data = r.python(part, "benchmarks/load.py", arguments, limit_s, TFORMER_MODEL_DIRS=str(models))
    part.data["models"] = made
    part.data["device"] = "the CPU" if r.dry else "one GPU"


def tests(r: Runner, part: Part, limit_s: float) -> None:
    absent = r.work / "absent.txt"
    absent.unlink(missing_ok=True)
    targets = ["tests/core/test_attention_steps.py"] if r.dry else ["tests/core", "tests/views"]
    command = [sys.executable, "-m", "pytest", *targets, "-p", "benchmarks.gpu.absent", "-p", "no:cacheprovider"]
    command += ["-v", "-rfEs", "--durations=0"]
    cores = os.cpu_count() or 1
    workers = 0 if r.dry or importlib.util.find_spec("xdist") is None else min(14, max(1, cores - 2))
    if workers:
        command += ["-n", str(workers)]
    text = r.run(part, command, limit_s, r.env(**{ABSENT_LOG: str(absent)}))
    counts = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
    summary = re.findall(r"=+ (.*\b(?:passed|failed|error|errors|skipped)\b.*) in [0-9.]+s", text)
    if summary:
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", summary[-1]):
            counts["error" if word.startswith("error") else word] = int(number)
    else:  # stopped before its summary: count the results it printed
        for outcome in re.findall(r"(?:^| )(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: |$)", text, re.M):
            key = {"XFAIL": "xfailed", "XPASS": "xpassed"}.get(outcome, outcome.lower())
            counts[key] += 1
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    left = absent.read_text().splitlines() if absent.is_file() else []
    part.data = {
        "device": "cpu" if r.dry else "cuda",
        "targets": targets,
        "workers": workers,
        "counts": counts,
        "failed": failed[:50],
        "skipped_absent": sorted(set(left)),
        "finished": bool(summary),
    }
    judge(part, text, limit_s)
    if part.exit == 1 and summary:  # pytest's "some tests failed": the counts say what; the part itself ran
        part.status, part.note = "ok", ""


RUNS: dict[str, Callable[[Runner, Part, float], None]] = {
    "environment": environment,
    "vs_transformers": vs_transformers,
    "half_precision": half_precision,
    "vision": vision,
    "capture_overhead": capture_overhead,
    "load": load,
    "tests": tests,
}


# ---- what the parts read -------------------------------------------------------------------------------------
def images() -> Path:
    """The photos vision.py cuts its pictures from: the ones that travelled, else ../shared's, else the app's."""
    for folder in (CARRIED / "images", SHARED / "images", ROOT / "assets" / "samples"):
        if any(folder.glob("*.png")):
            return folder
    return ROOT / "assets" / "samples"


def model_sources(carried: bool = True) -> dict[str, Path]:
    """Where MiniLM's and DeiT-Tiny's configs come from: the carried copies, else the installed package and
    ../shared (a developer's machine, CI)."""
    found = {}
    if carried and (CARRIED / "models" / TEXT_MODEL / "config.json").is_file():
        found[TEXT_MODEL] = CARRIED / "models" / TEXT_MODEL
    else:
        with contextlib.suppress(Exception):
            from tformer_core.checkpoints.sources import minilm_folder

            found[TEXT_MODEL] = minilm_folder()
    deit = [CARRIED / "models" / VISION_MODEL] if carried else []
    for folder in (*deit, SHARED / "models" / "deit-tiny-patch16-224"):
        if (folder / "config.json").is_file():
            found[VISION_MODEL] = folder
            break
    return found


def gather(dest: Path) -> list[str]:
    """Copy MiniLM's and DeiT-Tiny's configs and MiniLM's tokenizer (no weights) into dest/models/<name>/, and the
    shared photos into dest/images/ (bundle.sh)."""
    copied = [f"models/{path}" for path in gather_model_files(dest / "models")]
    for photo in sorted((SHARED / "images").glob("*")):
        (dest / "images").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(photo, dest / "images" / photo.name)
        copied.append(f"images/{photo.name}")
    return copied


def gather_model_files(dest: Path) -> list[str]:
    copied = []
    for name, source in model_sources(carried=False).items():
        for relative in MINILM_FILES if name == TEXT_MODEL else DEIT_FILES:
            if (source / relative).is_file():
                (dest / name / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / relative, dest / name / relative)
                copied.append(f"{name}/{relative}")
    return copied


# DeiT-Tiny's architecture and preprocessing (facebook/deit-tiny-patch16-224), for when its config is not at hand.
DEIT_TINY = {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3, "intermediate_size": 768}
DEIT_PREPROCESSING = {
    "do_resize": True,
    "size": {"shortest_edge": 256},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
    "image_processor_type": "DeiTImageProcessor",
}


def make_models(models: Path) -> list[str]:
    """MiniLM-L6 and DeiT-Tiny with random weights in models/<name>/: their configs (DeiT-Tiny's numbers when its
    file is not at hand) and MiniLM's tokenizer. MiniLM is left out when neither its carried files nor its
    package are here (the Text attention page then opens on its default)."""
    import torch
    import transformers as T

    sources = model_sources()
    made = []
    for name in (TEXT_MODEL, VISION_MODEL):
        folder = models / name
        if not (folder / "model.safetensors").is_file():
            source = sources.get(name)
            if source is None and name == TEXT_MODEL:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            if source is None:
                config = T.ViTConfig(**DEIT_TINY, num_labels=1000)
                (folder / "preprocessor_config.json").write_text(json.dumps(DEIT_PREPROCESSING, indent=1))
            else:
                for relative in MINILM_FILES if name == TEXT_MODEL else DEIT_FILES:
                    if (source / relative).is_file():
                        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(source / relative, folder / relative)
                config = T.AutoConfig.from_pretrained(folder)
            torch.manual_seed(0)
            model = T.BertModel(config) if name == TEXT_MODEL else T.ViTForImageClassification(config)
            model.save_pretrained(folder)
        made.append(name)
    return made


# ---- the table -----------------------------------------------------------------------------------------------
@dataclass
class Line:
    measure: str
    ours: str
    baseline: str
    ratio: str
    goal: str
    verdict: str
    values: dict = field(default_factory=dict)  # the numbers behind the line (the JSON's)
    part: str = ""


def verdict(ok: bool) -> str:
    return "within" if ok else "OVER"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def lines_of(part: Part) -> list[Line]:
    d = part.data
    out: list[Line] = []
    if part.name == "vs_transformers":
        for row in d.get("rows", []):
            peaks = row["ours_peak_mb"] is not None
            ours = ms(row["ours_s"]) + (f", peak {row['ours_peak_mb']:.0f} MB" if peaks else "")
            theirs = ms(row["theirs_s"]) + (f", peak {row['theirs_peak_mb']:.0f} MB" if peaks else "")
            out.append(
                Line(
                    f"traced forward / transformers eager with attentions: {row['model']}, {row['input']}, "
                    f"{row['dtype']}",
                    ours,
                    theirs,
                    f"{row['ratio']:.2f}x",
                    f"≤ {row['goal']}x",
                    verdict(row["ratio"] <= row["goal"]),
                    row,
                )
            )
        for s in d.get("speedups", []):
            out.append(
                Line(
                    f"bfloat16 / float32 speed, traced: {s['model']}, {s['input']}",
                    f"bfloat16 {ms(s['bfloat16_s'])}",
                    f"float32 {ms(s['float32_s'])}",
                    f"{s['speedup']:.2f}x faster",
                    f"≥ {s['goal']}x faster",
                    verdict(s["speedup"] >= s["goal"]),
                    s,
                )
            )
    elif part.name == "half_precision":
        for row in d.get("rows", []):
            for what in ("logits", "attention"):
                diff, bound = row[f"{what}_max_diff"], row[f"{what}_bound"]
                where = f", worst layer {row['attention_worst_layer']}" if what == "attention" else ""
                sharp = f" (row max mean {row['attention_row_max_mean']:.2f})" if what == "attention" else ""
                out.append(
                    Line(
                        f"{row['dtype']} {what} vs transformers {row['dtype']}: {row['model']}, {row['tokens']} tokens"
                        f"{sharp}",
                        f"max diff {diff:.3g}{where}",
                        f"bound {bound:.3g}",
                        f"{diff / bound:.2f} of the bound",
                        "≤ bound (4 roundings at the reference's largest magnitude)",
                        verdict(diff <= bound),
                        row,
                    )
                )
    elif part.name == "vision":
        for row in d.get("rows", []):
            out.append(
                Line(
                    f"mean attention distance, {row['pictures']} pictures, {row['model']}, {row['dtype']} "
                    f"(batches of {row['batch']}; max diff {row['max_diff_px']:.1e} px)",
                    f"{row['ours_s']:.2f} s",
                    f"transformers + torch {row['theirs_s']:.2f} s",
                    f"{row['ratio']:.2f}x",
                    f"≤ {row['goal_s']} s",
                    verdict(row["ours_s"] <= row["goal_s"]),
                    row,
                )
            )
    elif part.name == "capture_overhead":
        for row in d.get("rows", []):
            out.append(
                Line(
                    f"traced / plain forward ({d.get('dtype')}): {row['model']}, {row['input']} "
                    f"(trace {row['trace_mb']:.0f} MB)",
                    ms(row["ours_s"]),
                    ms(row["theirs_s"]),
                    f"{row['ratio']:.2f}x",
                    f"≤ {row['goal']}x",
                    verdict(row["ratio"] <= row["goal"]),
                    row,
                )
            )
    elif part.name == "load" and d.get("actions"):
        out += load_lines(d)
    elif part.name == "tests" and d.get("counts"):
        c = d["counts"]
        absent = len(d["skipped_absent"])
        ours = f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped"
        note = f" ({absent} of them need files that did not travel)" if absent else ""
        where = " + ".join(d["targets"])
        finished = "" if d["finished"] else " (stopped before the end)"
        ok = d["finished"] and c["failed"] == 0 and c["error"] == 0 and c["passed"] > 0
        out.append(Line(f"{where}, TFORMER_DEVICE={d['device']}{finished}", ours + note, "-", "-", "every test passes",
                        verdict(ok), d))  # fmt: skip
    return out


def load_lines(d: dict) -> list[Line]:
    out = []
    goal = d["verdict"]["goal_s"] if d.get("verdict") else LOAD_P95_GOAL_S
    head = f"{d['sessions']} students, {d['replicas']} replica(s) on {d.get('device', 'one GPU')}"
    for a in d["actions"]:
        view_change = a["action"] in ("layer change", "head change", "patch click")
        out.append(
            Line(
                f"{head}: {a['action']} ({a['count']} times)",
                f"p95 {a['p95_s']:.2f} s",
                f"p50 {a['p50_s']:.2f} s",
                "-",
                f"≤ {goal} s, 0 errors" if view_change else "-",
                verdict(a["p95_s"] <= goal and a["errors"] == 0) if view_change else f"{a['errors']} errors",
                a,
            )
        )
    warmed = d.get("warmed") or []
    if warmed:  # deploy/serve.py's warm-up: each replica opened the two pages before the students came
        pages = ", ".join(dict.fromkeys(w["page"] for w in warmed))
        failed = sum(1 for w in warmed if not w["ok"])
        out.append(
            Line(
                f"{head}: each replica opened {pages} before the class",
                f"slowest {max(w['seconds'] for w in warmed):.1f} s",
                "-",
                "-",
                "-",
                f"{failed} failed",
                {"warmed": warmed},
            )
        )
    rss = d["replica_rss_peak_mb"]
    gpu = [g for g in d["replica_gpu_peak_mb"] if g is not None]
    busy = d["gpu_utilisation_mean"]
    out.append(
        Line(
            f"{head}: GPU busy, GPU memory and RSS per replica",
            f"GPU busy {busy:.0f} % mean, {d['gpu_utilisation_max']:.0f} % max" if busy is not None else "no GPU seen",
            (f"GPU MB per replica ≤ {max(gpu):.0f}; " if gpu else "")
            + (f"RSS per replica ≤ {max(rss):.0f} MB (sum {d['replica_rss_sum_peak_mb']:.0f} MB)" if rss else ""),
            f"{d['throughput_per_s']:.1f} actions/s",
            "-",
            "-",
            {k: d[k] for k in d if k not in ("actions", "warmed")},  # the warm-up has its own line
        )
    )
    return out


def failure_line(part: Part) -> Line:
    why = part.note or "it wrote no figures (its output is in gpu_check.log)"
    return Line(f"part {part.name}", part.status, "-", "-", "-", f"{part.status.upper()}: {why}", part=part.name)


def write_report(args: argparse.Namespace, runner: Runner, parts: list[Part]) -> None:
    env = next((p.data for p in parts if p.name == "environment"), {})
    device = env.get("gpu") or ("CPU (dry run)" if args.dry_run else "no GPU seen")
    lines: list[Line] = []
    for part in parts:
        got = lines_of(part)
        for line in got:
            line.part = part.name
        lines += got
        if part.name != "environment" and (part.status != "ok" or not got):  # a part that gave no figure says why
            lines.append(failure_line(part))
    wall = time.time() - runner.started
    title = "GPU check" + (" (dry run on the CPU: tiny sizes, no figure to quote)" if args.dry_run else "")
    smi = f" (nvidia-smi: {env['nvidia_smi']})" if env.get("nvidia_smi") else ""
    packages = ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if v)
    text = [
        f"# {title}",
        "",
        f"Device: {device}{smi}; torch {env.get('torch')}, CUDA {env.get('cuda')}, transformers "
        f"{env.get('transformers')}, Python {env.get('python')}, {env.get('cpus')} CPUs; {packages}. Wall time "
        f"{wall:.0f} s. Random weights throughout (speed does not depend on the values).",
        "",
        "| measure | ours | baseline | ratio | goal | verdict |",
        "|---|---|---|---|---|---|",
        *(f"| {x.measure} | {x.ours} | {x.baseline} | {x.ratio} | {x.goal} | {x.verdict} |" for x in lines),
        "",
        "| part | status | seconds | note |",
        "|---|---|---:|---|",
        *(f"| {p.name} | {p.status} | {p.seconds:.0f} | {p.note} |" for p in parts),
        "",
    ]
    (args.out / "gpu_check.md").write_text("\n".join(text))
    report = {
        "device": device,
        "dry_run": args.dry_run,
        "wall_s": wall,
        "environment": env,
        "lines": [x.__dict__ for x in lines],
        "parts": {p.name: {k: v for k, v in p.__dict__.items() if k != "name"} for p in parts},
    }
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=finite))


def finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, tiny sizes (CI)")
    parser.add_argument("--budget-s", type=float, default=440.0, help="seconds for everything (dry run: none)")
    parser.add_argument("--only", help="these parts alone, comma-separated (environment is always run)")
    parser.add_argument("--replicas", type=int, help="the load's replicas (default: the cores less one)")
    parser.add_argument("--work", type=Path, help="checkpoints, models, cache (default: a fresh temporary folder)")
    parser.add_argument(
        "--gather", type=Path, help="copy the models' configs and the photos here, and stop (bundle.sh)"
    )
    args = parser.parse_args()
    if args.gather:
        for path in gather(args.gather):
            print(path)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.budget_s = max(args.budget_s, 900.0)
    with tempfile.TemporaryDirectory(prefix="tformer-gpu-check-") as temporary:
        args.work = args.work or Path(temporary)
        args.work.mkdir(parents=True, exist_ok=True)
        runner = Runner(args)
        chosen = set(args.only.split(",")) | {"environment"} if args.only else None
        parts = [p for p in PARTS if chosen is None or p.name in chosen]
        for i, part in enumerate(parts):
            left = runner.deadline - time.time() - sum(p.minimum_s for p in parts[i + 1 :])
            limit = part.dry_budget_s if args.dry_run else min(part.budget_s, left)
            if limit < part.minimum_s:
                part.status, part.note = "skipped", f"{max(left, 0):.0f} s left, it needs {part.minimum_s:.0f}"
                continue
            start = time.time()
            try:
                RUNS[part.name](runner, part, limit)
            except Exception as error:  # a part's own preparation failed: recorded, the next one runs
                part.status, part.note = "failed", f"{type(error).__name__}: {error}"[:300]
            part.seconds = time.time() - start
            print(f"{part.name}: {part.status} in {part.seconds:.0f} s {part.note}", flush=True)
            write_report(args, runner, parts)  # after every part: a call stopped early still brings its table
        runner.log.close()
    print((args.out / "gpu_check.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
