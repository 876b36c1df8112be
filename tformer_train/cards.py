"""Model cards of the bundled models, written from what a training run recorded in config.json.

The card text is a template beside this file (`cards/<name>.md`, Python format fields); this module
only works out the values. A card can be rewritten from a model folder at any time without training
again (`write_card(folder)`), and the tests check that the shipped cards match their folders.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from safetensors import safe_open

from tformer_core.bundled.loading import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE

from . import data as td

TEMPLATES = Path(__file__).resolve().parent / "cards"


def _n_params(weights: Path) -> int:
    """Parameters stored in a safetensors file (a tied matrix is stored, and counted, once)."""
    with safe_open(str(weights), framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118 (safe_open is not a dict)


def _size(folder: Path) -> str:
    size = (folder / WEIGHTS_FILE).stat().st_size
    n = _n_params(folder / WEIGHTS_FILE)
    return f"{n:,} parameters; `{WEIGHTS_FILE}` is {size:,} bytes ({size / 2**20:.2f} MiB, float32)"


def _environment(meta: dict) -> str:
    t = meta["training"]
    e = t["environment"]
    return (
        f"{t['train_seconds']:.0f} s wall time ({t['train_seconds'] / 60:.1f} min) on {e['threads']} CPU threads "
        f"({e['machine']}, torch {e['torch']}, Python {e['python']}), measured by the training script"
    )


def _common(meta: dict, folder: Path) -> dict:
    t = meta["training"]
    return {
        "c": meta["config"],
        "t": t,
        "r": t["recipe"],
        "m": meta["evaluation"],
        "sha": meta["weights_sha256"],
        "size": _size(folder),
        "environment": _environment(meta),
        "betas": str(tuple(t["recipe"]["betas"])),
    }


def _translator_fields(meta: dict) -> dict:
    m, n_heads = meta["evaluation"], meta["config"]["n_heads"]
    heads = "\n".join(
        f"| {layer} | " + " | ".join(f"{v:.1%}" for v in row) + " |"
        for layer, row in enumerate(m["alignment_accuracy_per_head"])
    )
    return {
        "examples": "\n".join(f"| {e['source']} | {e['reference']} | {e['model']} |" for e in m["examples"]),
        "heads": heads,
        "head_columns": " | ".join(f"head {h}" for h in range(n_heads)),
        "head_rule": "---|" * n_heads,
        "best": m["best_alignment_head"],
        "held_out_percent": td.HELD_OUT_PERCENT,
    }


def _vit_fields(meta: dict) -> dict:
    c, m, pre = meta["config"], meta["evaluation"], meta["preprocessing"]
    last = m["last_layer_attention"]
    grid = c["image_size"] // c["patch_size"]
    return {
        "classes": ", ".join(td.SHAPE_CLASSES),
        "train_stream_offset": td.TRAIN_STREAM_OFFSET,
        "grid": grid,
        "n_patches": grid**2,
        "mean": str(tuple(pre["mean"])),
        "std": str(tuple(pre["std"])),
        "per_class": ", ".join(f"{k} {v:.1%}" for k, v in m["per_class_accuracy"].items()),
        "a": last["any_pixel"],
        "h": last["half_covered"],
        "self_mass": 1 - last["class_token_mass_on_patches"],
        "per_layer": ", ".join(f"layer {i}: x{v:.2f}" for i, v in enumerate(m["foreground_ratio_per_layer"])),
    }


def _sentiment_fields(meta: dict) -> dict:
    m = meta["evaluation"]
    return {
        "pooling_rule": POOLING_RULES[meta["config"]["pooling"]],
        "per_class": ", ".join(f"{k} {v:.1%}" for k, v in m["test_per_class"].items()),
        "top_words": ", ".join(f"{w} ({n})" for w, n in m["most_often_top_word"]),
    }


POOLING_RULES = {
    "attention": "a small network scores every word, s_j = v^T tanh(h_j W_s + b_s), and the softmax of the "
    "scores over the sentence's words gives the weights",
    "mean": "every word gets the same weight, 1/n (mean pooling: the baseline without attention)",
}


def _rnn_fields(meta: dict) -> dict:
    m = meta["evaluation"]
    rules = {
        "additive": "Bahdanau's additive score e_mj = v^T tanh(W s_(m-1) + U h_j), from the state before step m; "
        "the context enters the GRU with the previous word",
        "dot": "Luong's dot score e_mj = s_m . h_j, from the state after step m",
        "bilinear": "Luong's bilinear (general) score e_mj = s_m^T W h_j, from the state after step m",
    }
    return {
        "score_rule": rules[meta["config"]["score"]],
        "examples": "\n".join(f"| {e['source']} | {e['reference']} | {e['model']} |" for e in m["examples"]),
    }


def _mae_fields(meta: dict) -> dict:
    c, m, pre = meta["config"], meta["evaluation"], meta["preprocessing"]
    n_patches = (c["image_size"] // c["patch_size"]) ** 2
    return {
        "classes": ", ".join(td.SHAPE_CLASSES),
        "train_stream_offset": td.TRAIN_STREAM_OFFSET,
        "n_patches": n_patches,
        "n_kept": int(n_patches * (1 - c["mask_ratio"])),
        "pixels_per_patch": c["patch_size"] ** 2 * c["n_channels"],
        "mean": str(tuple(pre["mean"])),
        "std": str(tuple(pre["std"])),
        "a": m["masked"],
        "s": m["masked_on_shape"],
    }


def _detr_fields(meta: dict) -> dict:
    c, m, pre = meta["config"], meta["evaluation"], meta["preprocessing"]
    stages = len(c["backbone_depths"])
    # The ResNet's stem halves the picture twice (a stride-2 convolution and a max pool); every stage after
    # the first halves it again.
    cell = 4 * 2 ** (stages - 1)
    return {
        "classes": ", ".join(c["labels"]),
        "train_stream_offset": td.TRAIN_STREAM_OFFSET,
        "stages": stages,
        "widths": ", ".join(str(w) for w in c["backbone_hidden_sizes"]),
        "depths": ", ".join(str(d) for d in c["backbone_depths"]),
        "cell": cell,
        "grid": pre["shortest_edge"] // cell,
        "n_logits": c["n_classes"] + 1,
        "pre": pre,
        "mean": str(tuple(pre["mean"])),
        "std": str(tuple(pre["std"])),
        "w": meta["training"]["loss_weights"],
        "by_count": ", ".join(
            f"{k} shape{'s' * (k != '1')} {v:.1%}" for k, v in m["recall_by_objects_in_scene"].items()
        ),
    }


FIELDS = {
    "translator": _translator_fields,
    "vit-tiny": _vit_fields,
    "sentiment": _sentiment_fields,
    "rnn": _rnn_fields,
    "mae-tiny": _mae_fields,
    "detr-tiny": _detr_fields,
}


def render(folder: str | Path) -> str:
    """The model card of the trained model in `folder`, from its config.json (which must hold its evaluation)."""
    folder = Path(folder)
    meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    name = meta["name"]
    if "evaluation" not in meta:
        raise ValueError(f"{folder / CONFIG_FILE} holds no evaluation: train without --no-eval to write a card")
    card = meta.get("card", name)  # several models may share one template (sentiment-attention, -mean)
    template = (TEMPLATES / f"{card}.md").read_text(encoding="utf-8")
    return template.format_map({**_common(meta, folder), **FIELDS[card](meta), "name": name})


def write_card(folder: str | Path) -> Path:
    """Write MODEL_CARD.md into `folder` (see `render`); returns its path."""
    path = Path(folder) / CARD_FILE
    path.write_text(render(folder), encoding="utf-8")
    return path
