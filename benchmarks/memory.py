"""Server memory under the inputs that once took a class's server from 1.8 GB to 17 GB, a class uploading photos and
a decoder writing long continuations; the baseline commit's code beside ours.

    python benchmarks/memory.py                       # ours, and the baseline commit (a git worktree) beside it
    python benchmarks/memory.py --skip-baseline       # ours only
    python benchmarks/memory.py --baseline-rev <rev>  # another baseline
    python benchmarks/memory.py --photos 40 --skip-smollm2   # a shorter run
    python benchmarks/memory.py --largest-configs     # only the table of the largest config each loader accepts

--largest-configs: for each loader family (bert, gpt2, llama, marian, bart, t5, vit, mae, detr, and the
transformers fallback), a model with random weights at the largest config TFORMER_PASS_MB accepts (a pages'
model's own sizes, and for a picture model the largest picture whose pass fits: ViT-B/16's image_size, DETR-R50's
shortest edge) is saved by transformers into a folder under a configured model folder, loaded by a fresh process
with tc.load_model, and run once over its largest input (a default trace: everything but the scores). The table
gives what the loader's estimate promised (tformer_core.pass_memory) beside the RSS the pass took at its peak (VmHWM
over the RSS before it, after a first pass and the freed memory handed back), and the budget.

Each server is started fresh (`streamlit run app.py` of its tree, offline, on the CPU, DeiT-Tiny from
../shared/models when it is there) and driven by simulated browsers (benchmarks/stclient.py) through, in order:

    warm-up   the Text attention page (MiniLM), the Mean attention distance page (vit-tiny) and the Vision
              Transformer page (DeiT-Tiny, else vit-tiny) with their defaults: their models loaded, a first result
    (a) text      64 distinct 512-token sentences typed into the Text attention page, one after another
    (b) distance  64 distinct 512-token lines on the Mean attention distance page, then 64 other ones
    (c) pictures  20 distinct 56-megapixel pictures (PNG, 8640 x 6480) uploaded to that page at once
    photos    160 distinct 12-megapixel JPEG photos (4032 x 3024, about 4.5 MB), each uploaded to the Vision page by
              a new session, which then closes (a class, one student after another)
    smollm2   8 distinct prompts of about 200 tokens on the Text attention page with smollm2, 64 new tokens each
    cleared   every session closed, Streamlit's time to resume a closed tab (server.disconnectedSessionTTL, 2 min)
              and the sweeps that release what those sessions held waited out, then the Server page's "Clear
              cached results" (the baseline's Server page has the same button)

The server's resident memory (RSS, /proc) is read after each step, with the step's peak. What each step may take
(ours; "models since" is read from the Server page's table):

    after a step   warm-up + models since + TFORMER_CACHE_MB (results, and the sessions' uploads and pictures)
                   + memory.SLACK (freed memory kept for the next pass)
    during a step  warm-up + models since + TFORMER_CACHE_MB + WORKING_MB (tformer_app/settings.py): the working
                   memory of the pass under way
    ("models since": their weights from the Server page, or for smollm2 what a fresh process grows by when it
    loads it, its freed memory handed back before and after: weights, tokenizer and tables. Read in the server,
    that growth is too small: the load reuses memory the process had freed, e.g. results its first trace evicted)
    photos         at most 1.10 x (warm-up + TFORMER_CACHE_MB)
    cleared        at most 1.10 x (warm-up + models since)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from stclient import Session

BASELINE_REV = "545e704"  # main before issue 21 (photos kept ~14.5 MB each); 443d66d is the code before issue 12
MB = 2**20
PICTURE_WH = (8640, 6480)  # 56 megapixels
PHOTO_WH = (4032, 3024)  # a phone's 12 megapixels
SHARED_MODELS = ROOT.parent / "shared" / "models"
RESUME_S = 120 + 2 * 30 + 15  # Streamlit keeps a closed tab 120 s; the sweeper needs two passes 30 s apart
WORDS = [
    "the",
    "animal",
    "street",
    "river",
    "teacher",
    "student",
    "model",
    "head",
    "layer",
    "token",
    "sentence",
    "picture",
    "quiet",
    "red",
    "long",
    "because",
    "although",
    "while",
    "after",
    "before",
    "near",
    "under",
    "over",
    "runs",
    "reads",
    "looks",
    "sees",
    "finds",
    "keeps",
    "carries",
    "a",
    "an",
    "old",
    "new",
    "small",
    "large",
    "bright",
    "dark",
    "early",
    "late",
    "every",
    "some",
    "many",
    "few",
]


def sentences(n: int, seed: int) -> list[str]:
    """n distinct texts of about 700 words: the page cuts each to MiniLM's 512 tokens."""
    rng = random.Random(seed)
    return [f"Text {seed}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(700)) for i in range(n)]


def pictures(n: int, folder: Path) -> list[tuple[str, bytes, str]]:
    """n distinct 56-megapixel PNGs (smooth colours: a few hundred kB each, under the upload limit),
    made once and kept in `folder`."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = folder / f"big-{i}.png"
        if not path.exists():
            w, h = PICTURE_WH
            row = np.linspace(0, 255, w, dtype=np.float32)
            rgb = np.stack([row, row[::-1], np.full(w, (37 * i) % 256, np.float32)], axis=-1).astype(np.uint8)
            image = Image.fromarray(np.broadcast_to(rgb, (h, w, 3)).copy())
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", compress_level=9)
            path.write_bytes(buffer.getvalue())
        out.append((path.name, path.read_bytes(), "image/png"))
    return out


def photos(n: int, folder: Path) -> list[tuple[str, bytes, str]]:
    """n distinct 12-megapixel JPEG photos (noise over smooth colours: about 4.5 MB each, like a phone's), made
    once and kept in `folder`."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = folder / f"photo-{i}.jpg"
        if not path.exists():
            rng = np.random.default_rng(i)
            w, h = PHOTO_WH
            small = Image.fromarray(rng.integers(0, 255, (h // 48, w // 48, 3), dtype=np.uint8))
            base = np.asarray(small.resize((w, h), Image.Resampling.BILINEAR), dtype=np.int16)
            noisy = (base + rng.integers(-20, 20, (h, w, 3), dtype=np.int16)).clip(0, 255).astype(np.uint8)
            Image.fromarray(noisy).save(path, quality=90)
        out.append((path.name, path.read_bytes(), "image/jpeg"))
    return out


def prompts(n: int) -> list[str]:
    """n distinct prompts of 200 words (about 200 smollm2 tokens: under the 256 a continuation starts from)."""
    return [" ".join(sentences(1, seed=100 + i)[0].split()[:200]) for i in range(n)]


def rss(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak(pid: int) -> None:
    """Start a new peak (VmHWM) for the next step (Linux: clear_refs 5); a no-op where not allowed."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(tree: Path, log: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TFORMER_DEVICE": "cpu", **env}
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
    command += ["--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=tree, env=environment, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/_stcore/health", timeout=2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the server of {tree} stopped:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


async def settled(session: Session, label: str, value: str, kind: str | None = None) -> None:
    run = await session.set_value(label, value, kind)
    if run.errors:
        raise RuntimeError(f"{label}: the page showed {run.errors[0][:300]}")


class Admin:
    """The Server page in a session of its own: its table (models and results MB) and its Clear button."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @classmethod
    async def open(cls, url: str, token: str) -> Admin:
        session = await Session.open(url, "/server", timeout_s=300)
        if any(w.label == "Admin token" for w in session.last.widgets()):  # ours asks for TFORMER_ADMIN_TOKEN
            await session.set_value("Admin token", token, "text_input")
        return cls(session)

    async def models_mb(self) -> float:
        """The MB of weights the server holds now, from the page's table."""
        from streamlit import dataframe_util

        run = await self.session.rerun()
        for _, element in run.items("dataframe"):
            table = dataframe_util.convert_arrow_bytes_to_pandas_df(element.dataframe.arrow_data.data)
            return float(table.set_index("cache").loc["models", "MB used"])
        raise RuntimeError("the Server page shows no table")

    async def clear(self) -> None:
        await self.session.click("Clear cached results")


@dataclass
class Figures:
    rss: dict[str, int] = field(default_factory=dict)  # step -> RSS after it ("... peak": during it)
    models: dict[str, float] = field(default_factory=dict)  # step -> MB of model weights held after it
    # MB the process grew by when a step's model first loaded (its weights, tokenizer, tables): from then on
    loaded: float = 0.0

    def step(self, name: str, pid: int, models_mb: float) -> None:
        self.rss[name], self.rss[f"{name} peak"] = rss(pid)
        self.models[name] = models_mb
        print(f"  {name}: RSS {self.rss[name] / MB:,.0f} MB (peak {self.rss[name + ' peak'] / MB:,.0f} MB)", flush=True)
        reset_peak(pid)


async def inputs_steps(url: str, pid: int, admin: Admin, figures: Figures, picture_files, n: int) -> list[Session]:
    """Steps (a), (b), (c) of the module docstring (n sentences and lines); returns the sessions they opened."""
    text = await Session.open(url, "/text", timeout_s=900)
    distance = await Session.open(url, "/distance", timeout_s=900)
    vision = await Session.open(url, "/vision", timeout_s=900)
    await vision.close()
    figures.rss["warm-up"] = rss(pid)[0]
    figures.models["warm-up"] = await admin.models_mb()
    reset_peak(pid)
    for sentence in sentences(n, seed=1):
        await settled(text, "Sentence", sentence)
    figures.step(f"(a) {n} sentences, text page", pid, await admin.models_mb())
    for seed in (2, 3):
        await settled(distance, "Sentences, one per line", "\n".join(sentences(n, seed=seed)))
    figures.step(f"(b) 2 x {n} lines, distance page", pid, await admin.models_mb())
    run = await distance.upload_files("And your own pictures", picture_files)
    if run.errors:
        raise RuntimeError(f"pictures: the page showed {run.errors[0][:300]}")
    figures.step(f"(c) {len(picture_files)} x 56 MP pictures, distance page", pid, await admin.models_mb())
    return [text, distance]


async def one_photo(url: str, name: str, data: bytes, mime: str) -> None:
    """A new session opens the Vision page, uploads one photo, sees its result, and closes."""
    session = await Session.open(url, "/vision", timeout_s=600)
    try:
        await settled(session, "Picture", "Upload", "radio")
        label = next(w.label for w in session.last.widgets() if w.kind == "file_uploader" and w.key == "vit.upload")
        run = await session.upload_files(label, [(name, data, mime)])
        if run.errors or not any("top 5" in h for h in run.headings()):
            raise RuntimeError(f"{name}: the page showed {(run.errors or ['no prediction'])[0][:300]}")
    finally:
        await session.close()


async def photos_step(url: str, pid: int, admin: Admin, figures: Figures, files) -> None:
    started = time.monotonic()
    for i, (name, data, mime) in enumerate(files):
        await one_photo(url, name, data, mime)
        if i % 40 == 39:
            print(f"  photos: {i + 1}, RSS {rss(pid)[0] / MB:,.0f} MB, {time.monotonic() - started:.0f} s", flush=True)
    figures.step(f"photos: {len(files)} x 12 MP, a new session each", pid, await admin.models_mb())


async def write(session: Session, prompt: str) -> None:
    """Type a prompt on the Text attention page; if the continuation is written on request, ask for it."""
    await settled(session, "Sentence", prompt, "text_area")
    buttons = [w for w in session.last.widgets() if w.kind == "button" and ("ontinu" in w.label or "Write" in w.label)]
    if buttons:
        run = await session.click(buttons[0].label)
        if run.errors:
            raise RuntimeError(f"continuation: the page showed {run.errors[0][:300]}")


FOOTPRINT = """
import gc, sys
from tformer_app import memory, models
memory.release_freed_memory()
before = memory.rss_bytes()
model = models.cached_model(sys.argv[1])
gc.collect()
memory.release_freed_memory()
print((memory.rss_bytes() - before) / 2**20)
"""


def footprint(source: str) -> float:
    """MB a fresh Python process grows by when it loads `source` the way the server does (its freed memory handed
    back before and after): the model's weights, its tokenizer and its tables."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TFORMER_DEVICE": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", FOOTPRINT, source], cwd=ROOT, env=environment, capture_output=True, text=True, check=True
    )
    return float(done.stdout.split()[-1])


async def smollm2_step(url: str, pid: int, admin: Admin, figures: Figures, n: int) -> None:
    before = rss(pid)[0]
    session = await Session.open(url, "/text?model=smollm2&new=64", timeout_s=1800)  # the default sentence
    grew = (rss(pid)[0] - before) / MB  # smollm2 loaded (a 12-token trace and continuation besides)
    figures.loaded = footprint("smollm2")
    print(
        f"  smollm2 loaded: the server grew by {grew:,.0f} MB; a fresh process by {figures.loaded:,.0f} MB", flush=True
    )
    try:
        for i, prompt in enumerate(prompts(n)):
            await write(session, prompt)
            print(f"  smollm2: {i + 1} prompts, RSS {rss(pid)[0] / MB:,.0f} MB", flush=True)
    finally:
        await session.close()
    figures.step(f"smollm2: {n} prompts x 64 new tokens", pid, await admin.models_mb())


async def drive(url: str, pid: int, token: str, args: argparse.Namespace, picture_files, photo_files) -> Figures:
    """The steps of the module docstring."""
    figures = Figures()
    admin = await Admin.open(url, token)
    sessions = await inputs_steps(url, pid, admin, figures, picture_files, args.sentences)
    if photo_files:
        await photos_step(url, pid, admin, figures, photo_files)
    if not args.skip_smollm2:
        await smollm2_step(url, pid, admin, figures, args.prompts)
    for session in sessions:
        await session.close()
    print(f"  waiting {RESUME_S} s: closed tabs are kept that long for resuming, then released", flush=True)
    await asyncio.sleep(RESUME_S)
    await admin.clear()
    await asyncio.sleep(2)
    figures.rss["cleared"] = rss(pid)[0]
    figures.models["cleared"] = await admin.models_mb()
    await admin.session.close()
    return figures


def measure(tree: Path, args: argparse.Namespace, picture_files, photo_files, log: Path) -> Figures:
    print(f"{tree}", flush=True)
    token = secrets.token_hex(16)
    env = {"TFORMER_ADMIN": "1", "TFORMER_ADMIN_TOKEN": token}
    if SHARED_MODELS.is_dir():
        env["TFORMER_MODEL_DIRS"] = str(SHARED_MODELS)
    with server(tree, log, **env) as (url, proc):
        return asyncio.run(drive(url, proc.pid, token, args, picture_files, photo_files))


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tformer-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)


def ceilings(ours: Figures, cache_mb: float, working_mb: float, slack_mb: float) -> dict[str, float]:
    """Step -> the most RSS ours may have then (module docstring)."""
    warm = ours.rss["warm-up"]
    out = {}
    for step in ours.rss:
        if step == "warm-up":
            continue
        base = step.removesuffix(" peak")
        weights = ours.models.get(base, ours.models["warm-up"]) - ours.models["warm-up"]
        models = max(weights, ours.loaded if base.startswith(("smollm2", "cleared")) else 0.0) * MB
        if step == "cleared":
            out[step] = 1.10 * (warm + models)
        elif step.startswith("photos") and not step.endswith("peak"):
            out[step] = 1.10 * (warm + cache_mb * MB)
        else:
            extra = working_mb if step.endswith("peak") else slack_mb  # a pass under way / freed memory kept
            out[step] = warm + models + (cache_mb + extra) * MB
    return out


def report(ours: Figures, baseline: Figures | None, cache_mb: float, working_mb: float, slack_mb: float) -> None:
    limits = ceilings(ours, cache_mb, working_mb, slack_mb)
    print("\n| step | baseline RSS | ours RSS | ours / baseline | ours may take | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for step, value in ours.rss.items():
        base = baseline.rss.get(step) if baseline else None
        ratio = f"{value / base:.2f}" if base else "-"
        base_text = f"{base / MB:,.0f} MB" if base else "-"
        limit = limits.get(step)
        verdict = "-" if limit is None else ("within" if value <= limit else "OVER")
        limit_text = "-" if limit is None else f"{limit / MB:,.0f} MB"
        print(f"| {step} | {base_text} | {value / MB:,.0f} MB | {ratio} | {limit_text} | {verdict} |")
    warm = ours.rss["warm-up"]
    print(
        f"\nOurs: post-warm-up {warm / MB:,.0f} MB ({ours.models['warm-up']:,.0f} MB of models); TFORMER_CACHE_MB "
        f"{cache_mb:,.0f} MB; smollm2 grows a fresh process by {ours.loaded:,.0f} MB when it loads; freed memory kept "
        f"for the next pass: at most {slack_mb:,.0f} MB (memory.SLACK); a pass's working memory reserved: "
        f"{working_mb:,.0f} MB (WORKING_MB x TFORMER_PASSES)."
    )
    over = [step for step, limit in limits.items() if ours.rss[step] > limit]
    print("Every step within its ceiling." if not over else f"OVER: {', '.join(over)}.")


# ---- --largest-configs: the largest config each loader accepts, one pass each ------------------------------------
PASS_SCRIPT = """
import gc, json, sys
from pathlib import Path
import numpy as np, torch
from PIL import Image
import tformer_core as tc
from tformer_app import memory
from tformer_core import pass_memory

def rss():
    fields = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines() if ":" in l)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

folder = Path(sys.argv[1])
model = tc.load_model(str(folder), device="cpu", model_dirs=[folder.parent])
pre = getattr(model, "preprocessing", None)
if model.kind in ("vit", "mae", "detr"):
    W, H = pass_memory.detr_picture_size(pre) if model.kind == "detr" else model.config.image_hw[::-1]
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8))
    run = (lambda: model.trace(pre(picture), seed=0)) if model.kind == "mae" else (lambda: model.trace(pre(picture)))
    warm = run
else:
    T = model.token_limit
    ids = [int(i) for i in np.random.default_rng(0).integers(5, 1000, T)]
    if model.kind == "encoder-decoder":
        run, warm = (lambda: model.trace(ids, ids)), (lambda: model.trace(ids[:8], ids[:8]))
    else:
        run, warm = (lambda: model.trace(ids)), (lambda: model.trace(ids[:8]))
estimate = pass_memory.pass_cost(model.config, pre, tokens=model.pass_tokens)
with torch.inference_mode():
    warm()
    gc.collect(); memory.release_freed_memory()
    Path("/proc/self/clear_refs").write_text("5")
    before = rss()[0]
    trace = run()
    peak = rss()[1]
print(json.dumps({"input": estimate.input, "estimate": estimate.total, "measured": peak - before,
                  "kept": trace.nbytes, "pass_tokens": model.pass_tokens}))
"""


def _largest_picture(config_of, sizes) -> int:
    """The largest of `sizes` whose pass the estimate admits within TFORMER_PASS_MB (config_of(size) -> the core
    config and its preprocessing)."""
    from tformer_core import pass_memory
    from tformer_core.checkpoints.limits import pass_bytes

    fits = [size for size in sizes if pass_memory.pass_cost(*config_of(size)).total <= pass_bytes()]
    return max(fits)


def _save_largest(family: str, folder: Path) -> str:
    """A random-weights checkpoint of `family` at the largest config the loaders accept, saved into `folder`;
    returns what it is, in words."""
    import json as json_module

    import torch
    import transformers as T

    import tformer_core as tc
    from tformer_core.models.detr import DETRConfig, DetrPreprocessing
    from tformer_core.models.mae import MAEConfig

    torch.manual_seed(0)
    base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    if family == "bert":
        T.BertForMaskedLM(T.BertConfig(**base)).save_pretrained(folder)
        return "BERT-base, masked-word head"
    if family == "gpt2":
        T.GPT2LMHeadModel(T.GPT2Config()).save_pretrained(folder)
        return "GPT-2 (124 M), 1,024 positions"
    if family == "llama":
        config = T.LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
        )  # fmt: skip
        T.LlamaForCausalLM(config).save_pretrained(folder)
        return "SmolLM2-135M's shape, 8,192 positions"
    if family == "marian":
        config = T.MarianConfig(
            vocab_size=58101, decoder_vocab_size=58101, pad_token_id=58100, d_model=512, encoder_layers=6,
            decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
            decoder_ffn_dim=2048, max_position_embeddings=512,
        )  # fmt: skip
        T.MarianMTModel(config).save_pretrained(folder)
        return "opus-mt's shape (6 + 6 layers, 512 wide)"
    if family == "bart":
        widths = dict(d_model=768, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
        config = T.BartConfig(encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, **widths)
        config.decoder_attention_heads = 12
        T.BartForConditionalGeneration(config).save_pretrained(folder)
        return "BART-base's shape, 1,024 positions"
    if family == "t5":
        T.T5ForConditionalGeneration(T.T5Config()).save_pretrained(folder)
        return "t5-small's shape"
    if family == "fallback":
        T.ElectraForMaskedLM(T.ElectraConfig(embedding_size=768, **base)).save_pretrained(folder)
        return "ELECTRA-base (run by transformers)"
    if family == "vit":
        vit_b = dict(patch_size=16, n_layers=12, d_model=768, n_heads=12, d_ff=3072, n_classes=1000)
        size = _largest_picture(lambda s: (tc.ViTConfig(image_size=s, **vit_b),), range(224, 2048, 16))
        config = T.ViTConfig(image_size=size, num_labels=1000, **base)
        T.ViTForImageClassification(config).save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json_module.dumps({"size": {"height": size, "width": size}}))
        return f"ViT-B/16 at {size} px, the largest accepted"
    if family == "mae":
        mae_b = dict(patch_size=16, n_layers=12, d_model=768, n_heads=12, d_ff=3072)
        mae_b |= dict(decoder_d_model=512, decoder_n_heads=16, decoder_d_ff=2048, decoder_n_layers=8)
        size = _largest_picture(lambda s: (MAEConfig(image_size=s, **mae_b),), range(224, 2048, 16))
        T.ViTMAEForPreTraining(T.ViTMAEConfig(image_size=size, **base)).save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json_module.dumps({"size": {"height": size, "width": size}}))
        return f"ViT-MAE-base at {size} px, the largest accepted"
    if family == "detr":
        r50 = DETRConfig(d_model=256, n_heads=8, d_ff=2048)
        edge = _largest_picture(lambda e: (r50, DetrPreprocessing(e, round(e * 1333 / 800))), range(800, 4096, 16))
        backbone = T.ResNetConfig(out_features=["stage4"])
        config = T.DetrConfig(backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False)
        T.DetrForObjectDetection(config).save_pretrained(folder)
        sizes = {"size": {"shortest_edge": edge, "longest_edge": round(edge * 1333 / 800)}}
        (folder / "preprocessor_config.json").write_text(json_module.dumps(sizes))
        return f"DETR-R50 at {edge} x {round(edge * 1333 / 800)} px, the largest accepted"
    raise ValueError(family)


LARGEST_FAMILIES = ("bert", "gpt2", "llama", "marian", "bart", "t5", "fallback", "vit", "mae", "detr")


def largest_configs(families: list[str]) -> None:
    """The table of --largest-configs (module docstring)."""
    import json as json_module

    from tformer_core.checkpoints.limits import pass_bytes

    budget = pass_bytes() / MB
    print(f"TFORMER_PASS_MB: {budget:,.0f} MB. Load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs.")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tformer-largest-") as tmp:
        models = Path(tmp) / "models"
        for family in families:
            folder = models / family
            what = _save_largest(family, folder)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TFORMER_DEVICE": "cpu", "TFORMER_MODEL_DIRS": str(models)}
            done = subprocess.run(
                [sys.executable, "-c", PASS_SCRIPT, str(folder)], cwd=ROOT, env=env, capture_output=True, text=True
            )
            if done.returncode:
                print(f"  {family}: failed\n{done.stderr[-2000:]}", flush=True)
                continue
            figures = json_module.loads(done.stdout.strip().splitlines()[-1])
            rows.append((family, what, figures))
            print(f"  {family}: {figures}", flush=True)
            shutil.rmtree(folder)
    print(
        "\n| family | model | input | estimate (promised) | measured peak | measured / estimate | kept by the trace "
        "| budget | verdict |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for family, what, f in rows:
        estimate, measured = f["estimate"] / MB, f["measured"] / MB
        verdict = "within" if measured <= budget else "OVER"
        print(
            f"| {family} | {what} | {f['input']} | {estimate:,.0f} MB | {measured:,.0f} MB | {measured / estimate:.2f} "
            f"| {f['kept'] / MB:,.0f} MB | {budget:,.0f} MB | {verdict} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--sentences", type=int, default=64, help="sentences of (a), lines of (b)")
    parser.add_argument("--pictures", type=int, default=20, help="56-megapixel pictures of (c)")
    parser.add_argument("--photos", type=int, default=160, help="photos uploaded, each by a new session (0: none)")
    parser.add_argument("--prompts", type=int, default=8, help="smollm2 prompts of 64 new tokens each")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--largest-configs", action="store_true", help="only the largest config each loader accepts")
    parser.add_argument("--families", default=",".join(LARGEST_FAMILIES), help="with --largest-configs")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.largest_configs:
        largest_configs([f for f in args.families.split(",") if f])
        return
    from tformer_app.memory import SLACK
    from tformer_app.settings import WORKING_MB, server_settings

    settings = server_settings()
    cache = Path(tempfile.gettempdir()) / "tformer-memory-benchmark"
    picture_files = pictures(args.pictures, cache / "pictures")
    photo_files = photos(args.photos, cache / "photos")
    print(
        f"Load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min); "
        f"{os.cpu_count()} CPUs; {sum(len(d) for _, d, _ in photo_files) / MB:,.0f} MB of photos"
    )
    logs = Path(tempfile.mkdtemp(prefix="tformer-memory-logs-"))
    baseline = None
    if not args.skip_baseline:
        with worktree(args.baseline_rev) as tree:
            baseline = measure(tree, args, picture_files, photo_files, logs / "baseline.log")
    ours = measure(ROOT, args, picture_files, photo_files, logs / "ours.log")
    report(ours, baseline, settings.cache_bytes / MB, WORKING_MB * settings.passes, SLACK / MB)
    print(f"\nLoad average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}. Server logs: {logs}")


if __name__ == "__main__":
    main()
