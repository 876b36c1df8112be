"""The vision pages' budgets: one picture's trace and every overlay of a layer; mean attention distance over
128 pictures; and what one layer / head / query change costs the page.

    python benchmarks/vision.py [--repeats 7] [--device cuda] [--dtype bfloat16] [--vit-b] [--pictures 128]
                                [--vit-b-only] [--images DIR] [--folder DIR] [--tiny] [--json PATH]

Models: the real DeiT-Tiny from ../shared/models (rows skipped when it is absent) and, on a GPU (or with --vit-b),
a ViT-B/16 with random weights (speed does not depend on the values), saved once and loaded by both sides.

1. One 224-px picture (../shared/images/dogbird.png): ours = read the file, preprocess, trace, and
   draw every picture the page shows for one layer (class-token overlay per head and their mean,
   the all-heads strip, a query-patch overlay, rollout, the patch picker), PNG-encoded as sent.
   Baseline: transformers' eager forward of the same checkpoint with output_attentions=True on the
   same picture (its own image processor), in the same run. Budget: ours <= 300 ms on 2 CPU cores.
2. Mean attention distance over 128 pictures (crops and flips of the shared photos): ours =
   tformer_views.distance.distances_over_images (batches of 32, weights only kept, reduced on the device).
   Baseline: transformers' forward over the same batches with output_attentions=True plus the same distance
   computed in numpy. Budget: ours <= 30 s on CPU.
   ViT-B/16 (on a GPU, or --vit-b): ours with its automatic batch size, against transformers' forward with
   attentions over batches of the same size and the same reduction in torch on the device, both from the same
   preprocessed pictures (the preprocessing, on the CPU, is timed apart). Budget: <= 1.0 s on a GPU.
3. A layer / head / query change on the Vision Transformer page (AppTest: script run, element
   messages), with the forward passes counted (must be 0), and the bytes of the pictures sent.

--vit-b-only: the ViT-B/16 row alone, in each of --dtype's (e.g. float32,bfloat16; benchmarks/gpu/check.py).
--images: the photos the pictures are cut from (default ../shared/images; flat colours when the folder has none).
--folder: where the ViT-B/16 checkpoint is kept (vs_transformers.py's, shared with it). --tiny: a ViT of two layers
of width 64 on 32-px pictures instead of ViT-B/16 (a dry run's; no figure to quote). --json: the ViT-B/16 rows,
also written to that file.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np
import torch
import transformers as T
from PIL import Image, ImageOps
from timing import sync

import tformer_core as tc
from tformer_core.metrics import patch_centre_distances
from tformer_views import distance, pictures
from tformer_views import vision as vv
from tformer_views.charts import pickers
from tformer_views.pictures import to_jpeg

SHARED = ROOT.parent / "shared"
DEIT = SHARED / "models" / "deit-tiny-patch16-224"
PHOTO = SHARED / "images" / "dogbird.png"


def median_time(fn, repeats: int, device: torch.device) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def page_pictures(model, data: bytes, layer: int) -> int:
    """Everything the Vision Transformer page computes for one picture and one layer; returns the bytes sent.

    (The grid and patch-sequence pictures are drawn once per picture, not per layer: not counted here.)
    """
    r = vv.analyse(model, data, "photo.png")
    t = r.trace
    shown = [
        vv.head_overlays(r, layer, None),  # every head and their mean
        pictures.overlay(r.image, vv.attention_map(t, layer, 0, patch=100)),
        pictures.overlay(r.image, vv.rollout_map(t, "mean", 0.9)),
    ]
    sent = sum(len(to_jpeg(p)) for p in shown)  # as the page sends them
    picked = pictures.overlay(r.image, vv.attention_map(t, layer, None))
    spec = pickers.patch_picker(picked, r.grid_hw, None)
    return sent + sum(len(f["url"][0]) for f in spec["datasets"].values() if "url" in f)


def crops(n: int, folder: Path = SHARED / "images") -> list[Image.Image]:
    """n different pictures from the photos in `folder` (the shared ones by default): random crops, flips and
    scales (seeded)."""
    rng = np.random.default_rng(0)
    photos = [Image.open(p).convert("RGB") for p in sorted(folder.glob("*.png"))]
    out = []
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = photo.size
        s = rng.uniform(0.5, 1.0)
        cw, ch = int(w * s), int(h * s)
        x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
        crop = photo.crop((x, y, x + cw, y + ch))
        out.append(ImageOps.mirror(crop) if i % 2 else crop)
    return out


def hf_mad(hf, processor, pictures, batch: int, device) -> np.ndarray:
    distances = patch_centre_distances((14, 14), 16)
    out = []
    with torch.inference_mode():
        for start in range(0, len(pictures), batch):
            inputs = processor(images=pictures[start : start + batch], return_tensors="pt").to(device)
            attentions = hf(**inputs, output_attentions=True).attentions
            w = torch.stack(attentions, 1).float().cpu().numpy()[..., 1:, 1:]  # [b, layers, heads, N, N]
            out.append((w * distances).sum(-1).mean(-1))
    return np.concatenate(out)


def page_switch(repeats: int) -> tuple[float, float, int]:
    """(median seconds of a layer / head / query change on the page, median seconds of a new picture on the
    same page (the baseline: one forward pass and every picture drawn), forward passes run during the changes)."""
    from streamlit.testing.v1 import AppTest

    from tests.app.passes import PassCounter
    from tformer_app import models

    os.environ["TFORMER_MODEL_DIRS"] = str(DEIT.parent)
    at = AppTest.from_file(str(ROOT / "app_pages" / "vision.py"), default_timeout=300)
    at.query_params.update({"model": str(DEIT), "from": "upload"})
    at.run()
    at.file_uploader(key="vit.upload").set_value((PHOTO.name, PHOTO.read_bytes(), "image/png")).run()

    def widget(key):
        return next(w for w in at.main if getattr(w, "key", None) == key)

    times = []
    with PassCounter(models.cached_model(str(DEIT))) as counter:
        for i in range(repeats + 1):
            widget("vit.layer").set_value(i % 12)
            widget("vit.head").set_value([-1, 0, 1, 2][i % 4])
            widget("vit.query").set_value([-1, 17, 100, 150][i % 4])
            start = time.perf_counter()
            at.run()
            if i:
                times.append(time.perf_counter() - start)
            assert not at.exception, [e.value for e in at.exception]
    new_picture = []
    for i, crop in enumerate(crops(repeats)):
        buffer = io.BytesIO()
        crop.save(buffer, format="PNG")
        at.file_uploader(key="vit.upload").set_value((f"crop{i}.png", buffer.getvalue(), "image/png"))
        start = time.perf_counter()
        at.run()
        new_picture.append(time.perf_counter() - start)
        assert not at.exception, [e.value for e in at.exception]
    return statistics.median(times), statistics.median(new_picture), counter.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype", default="float32", help="float32, bfloat16 or float16: both sides load in it (--vit-b-only: several)"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--vit-b", action="store_true", help="the ViT-B/16 distance row on the CPU too")
    parser.add_argument("--pictures", type=int, default=128, help="pictures of the ViT-B/16 distance row")
    parser.add_argument("--vit-b-only", action="store_true", help="the ViT-B/16 distance row alone")
    parser.add_argument("--images", type=Path, default=SHARED / "images", help="photos the pictures are cut from")
    parser.add_argument("--folder", type=Path, help="keep the ViT-B/16 checkpoint here (default: a temporary one)")
    parser.add_argument("--tiny", action="store_true", help="a tiny ViT instead of ViT-B/16 (a dry run)")
    parser.add_argument("--json", type=Path, help="also write the ViT-B/16 row to this file")
    args = parser.parse_args()
    if "," in args.dtype and not args.vit_b_only:
        parser.error("several dtypes only with --vit-b-only")
    device = torch.device(args.device)
    print(
        f"Vision pages on {device.type.upper()}, torch {torch.__version__}, "
        f"CPU threads {torch.get_num_threads()}; medians of {args.repeats}.\n"
    )
    if args.vit_b_only:
        print("(DeiT-Tiny rows left out: --vit-b-only)")
    elif not DEIT.is_dir():
        print(f"(DeiT-Tiny rows skipped: {DEIT} is not present)")
    else:
        model = tc.load_model(str(DEIT), device=device, dtype=args.dtype, model_dirs=[DEIT.parent])
        processor = T.AutoImageProcessor.from_pretrained(str(DEIT))
        hf = T.AutoModelForImageClassification.from_pretrained(
            str(DEIT), dtype=model.dtype, attn_implementation="eager"
        )
        hf = hf.eval().to(device)
        data = PHOTO.read_bytes()
        picture = Image.open(io.BytesIO(data)).convert("RGB")
        sent = page_pictures(model, data, 11)
        ours = median_time(lambda: page_pictures(model, data, 11), args.repeats, device)

        def baseline():
            with torch.inference_mode():
                hf(**processor(images=picture, return_tensors="pt").to(device), output_attentions=True)

        base = median_time(baseline, args.repeats, device)
        print("1. One 224-px picture: read + preprocess + trace + every picture of one layer")
        print(
            f"| DeiT-Tiny | ours {ours * 1e3:7.1f} ms | transformers forward {base * 1e3:7.1f} ms | ratio "
            f"{ours / base:5.2f}x | pictures sent {sent / 2**10:.0f} KB (JPEG) | budget 300 ms: "
            f"{'within' if ours <= 0.3 else 'OVER'} |\n"
        )

        pictures = crops(128)
        start = time.perf_counter()
        ours_mad = distance.distances_over_images(model, pictures, batch_size=32)
        sync(device)
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        theirs = hf_mad(hf, processor, pictures, 32, device)
        sync(device)
        t_base = time.perf_counter() - start
        diff = float(np.abs(ours_mad - theirs).max())
        print("2. Mean attention distance over 128 pictures (batches of 32)")
        print(
            f"| DeiT-Tiny | ours {t_ours:6.2f} s | transformers + numpy {t_base:6.2f} s "
            f"| ratio {t_ours / t_base:5.2f}x "
            f"| max |difference| {diff:.1e} px | budget 30 s: {'within' if t_ours <= 30 else 'OVER'} |"
        )

        if device.type == "cpu":
            switch, new_picture, passes = page_switch(args.repeats)
            print("\n3. Vision Transformer page, server time of a rerun (AppTest, DeiT-Tiny)")
            print(
                f"| layer + head + query change {switch * 1e3:.0f} ms "
                f"| baseline: a new picture {new_picture * 1e3:.0f} ms "
                f"| ratio {switch / new_picture:.2f}x | forward passes during the changes: {passes} (must be 0) |"
            )
    if device.type == "cuda" or args.vit_b or args.vit_b_only:
        vit_b_distances(args, device)


def vit_b_distances(args, device: torch.device) -> None:
    """Mean attention distance of a ViT-B/16 over many pictures, in each dtype asked for: ours against transformers
    + torch on the device."""
    from vs_transformers import TINY, Sizes, checkpoint

    sizes = TINY if args.tiny else Sizes()
    n = args.pictures
    if any(args.images.glob("*.png")):
        pictures = crops(n, args.images)
    else:
        pictures = [Image.new("RGB", (320, 240), (i % 256, 90, 30)) for i in range(n)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows = []
    with tempfile.TemporaryDirectory(prefix="tformer-vitb-") as temporary:
        folder = args.folder or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        path = checkpoint("vit-b16", folder, sizes, device)
        for dtype in args.dtype.split(","):
            rows.append(vit_b_row(path, sizes, pictures, dtype, device, where))
    if args.json:
        report = {"device": where, "torch": torch.__version__, "transformers": T.__version__, "rows": rows}
        args.json.write_text(json.dumps(report, indent=1))


def vit_b_row(path: Path, sizes, pictures: list[Image.Image], dtype: str, device: torch.device, where: str) -> dict:
    from vs_transformers import pair, title

    from tformer_core.inputs.preprocessing import ImagePreprocessing

    big, hf = pair(path, "vit-b16", device, dtype)
    side = hf.config.image_size
    big.preprocessing = ImagePreprocessing(resize=("exact", (side, side)))
    batch = distance.auto_batch_size(big)
    distance.distances_over_images(big, pictures[:batch])  # warm-up
    sync(device)
    start = time.perf_counter()
    ours = distance.distances_over_images(big, pictures)
    sync(device)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    tensors = [big.preprocessing(p) for p in pictures]
    t_pre = time.perf_counter() - start
    theirs, t_base = hf_mad_on_device(hf, tensors, batch, device)
    diff = float(np.abs(ours - theirs).max())
    goal = 1.0 if device.type == "cuda" else None
    verdict = "" if goal is None else f" | budget {goal} s: {'within' if t_ours <= goal else 'OVER'}"
    name = title("vit-b16", sizes)
    print(f"\nMean attention distance, {name}, {len(pictures)} pictures, {dtype}, on {where}, batches of {batch}")
    print(
        f"| ours {t_ours:.2f} s (of which preprocessing on the CPU {t_pre:.2f} s) "
        f"| transformers + torch on the device {t_base + t_pre:.2f} s | ratio {t_ours / (t_base + t_pre):.2f}x "
        f"| max |difference| {diff:.1e} px{verdict} |"
    )
    return {
        "model": name,
        "pictures": len(pictures),
        "dtype": dtype,
        "batch": batch,
        "ours_s": t_ours,
        "preprocessing_s": t_pre,
        "theirs_s": t_base + t_pre,
        "ratio": t_ours / (t_base + t_pre),
        "max_diff_px": diff,
        "goal_s": 1.0,
    }


def hf_mad_on_device(hf, tensors: list[torch.Tensor], batch: int, device) -> tuple[np.ndarray, float]:
    """transformers' forward with attentions over `tensors` in batches, the distance reduced on the device: the
    figures and the seconds (preprocessing not included)."""
    grid = hf.config.image_size // hf.config.patch_size
    distances = torch.from_numpy(patch_centre_distances((grid, grid), hf.config.patch_size)).to(device).float()
    out = []
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(tensors), batch):
            x = torch.stack(tensors[i : i + batch]).to(device=device, dtype=hf.dtype)
            attentions = hf(pixel_values=x, output_attentions=True).attentions
            per_layer = [(w[..., 1:, 1:].float() * distances).sum(-1).mean(-1) for w in attentions]  # [b, heads]
            out.append(torch.stack(per_layer, 1).cpu().numpy())
    sync(device)
    return np.concatenate(out), time.perf_counter() - start


if __name__ == "__main__":
    main()
