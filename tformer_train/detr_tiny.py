"""The bundled DETR: a small detector trained by this project on generated scenes of several shapes.

    python -m tformer_train.train detr-tiny       # -> ./trained/detr-tiny/

64 x 64 scenes of 1 to 4 shapes of the eight classes (`data.make_detection_scenes`), each with its class
and its box. The model is the core's `DETR`: a tiny ResNet (transformers' ResNetBackbone, basic blocks,
two stages: one feature cell per 8 x 8 pixels, an 8 x 8 grid), a post-norm encoder-decoder and a few object
queries. Training is DETR's (Carion et al. 2020): each scene's objects are matched one-to-one to the queries
by the least total cost (class probability, L1 distance and generalised IoU of the boxes: `boxes.assign`,
exact), then the matched queries learn their object's class and box and the others "no object"; every
decoder layer's output is scored so (the paper's auxiliary losses), which speeds up learning.

`evaluate_detr` counts, on held-out scenes, the detections a person sees on the page (the queries whose most
likely class has probability >= 0.7) that cover an object of their class with IoU >= 0.5.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tformer_core.bundled.loading import config_to_dict, detr_preprocessing_from_meta
from tformer_core.models.detr import DETR, DETRConfig

from . import data as td
from .boxes import assign, box_iou, cxcywh_to_xyxy, generalized_iou, xyxy_to_cxcywh
from .evaluation import EVAL_SEED
from .runs import (
    DEFAULT_OUT,
    Log,
    Recipe,
    RunResult,
    command_line,
    deterministic,
    environment_record,
    optimise,
    write_run,
)

NAME = "detr-tiny"

DETR_CONFIG = DETRConfig(
    d_model=64,
    n_heads=4,
    d_ff=128,
    n_encoder_layers=2,
    n_decoder_layers=2,
    n_queries=10,
    n_classes=len(td.SHAPE_CLASSES),
    labels=td.SHAPE_CLASSES,
    backbone_layer_type="basic",
    backbone_embedding_size=16,
    backbone_hidden_sizes=(32, 64),
    backbone_depths=(1, 1),
)
S = td.DETECTION_IMAGE_SIZE
DETR_PREPROCESSING = {
    "shortest_edge": S,
    "longest_edge": S,
    "mean": [0.5, 0.5, 0.5],
    "std": [0.3, 0.3, 0.3],
    "formula": "resized so the shorter side is 64 px and the longer at most 64 px (aspect kept), "
    "pixel = (value / 255 - mean) / std, per channel, RGB, (3, H, W)",
}
DETR_RECIPE = Recipe(
    steps=7000, batch_size=32, lr=5e-4, warmup=300, weight_decay=1e-4, betas=(0.9, 0.999), grad_clip=0.1
)
# DETR's weights: of the class, L1 and GIoU terms, in the matching cost and in the loss alike; "no object"
# counts a tenth (most queries have no object: unweighted, they would teach every query to say none).
CLASS_WEIGHT, L1_WEIGHT, GIOU_WEIGHT, NO_OBJECT_WEIGHT = 1.0, 5.0, 2.0, 0.1
THRESHOLD = 0.7  # the DETR page's default: a detection is a query whose best class has at least this probability
IOU_MATCH = 0.5


def decoded_layers(model: DETR, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(class logits (B, Q, classes + 1), boxes (B, Q, 4) cx, cy, w, h in [0, 1]) after every decoder layer, for
    normalised images (B, 3, H, W): each layer's queries through the final LayerNorm and the heads, as DETR's
    auxiliary losses read them. The last is `model(images)`."""
    memory, pos = model.encoder(model.backbone(images))  # (B, hw, D) each
    query_pos = model.decoder.queries.weight[None].expand(images.shape[0], -1, -1)  # (B, Q, D)
    y = torch.zeros_like(query_pos)
    out = []
    for block in model.decoder.block_list:
        y = block(y, query_pos, memory, pos)
        out.append(model.head(model.decoder.ln_final(y)))
    return out


def normalised_targets(scenes: td.DetectionScenes) -> torch.Tensor:
    """(B, MAX_OBJECTS, 4) the objects' boxes as the model predicts them: cx, cy, w, h as fractions of the picture."""
    return xyxy_to_cxcywh(scenes.boxes / scenes.images.shape[-1])


@torch.no_grad()
def match(logits: torch.Tensor, boxes: torch.Tensor, scenes: td.DetectionScenes) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each scene, (queries (k,), objects (k,)): its k objects matched one-to-one to the queries of least total
    cost. logits (B, Q, classes + 1), boxes (B, Q, 4) cx, cy, w, h."""
    targets = normalised_targets(scenes)  # (B, K, 4)
    probs = logits.softmax(-1)  # (B, Q, classes + 1)
    labels = scenes.labels.clamp(min=0)  # padding (-1) reads class 0; its columns are never used
    class_cost = -torch.gather(probs, 2, labels[:, None, :].expand(-1, probs.shape[1], -1))  # (B, Q, K)
    l1_cost = torch.cdist(boxes, targets, p=1)  # (B, Q, K)
    giou_cost = -generalized_iou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(targets))
    cost = (CLASS_WEIGHT * class_cost + L1_WEIGHT * l1_cost + GIOU_WEIGHT * giou_cost).cpu().numpy()
    return [assign(cost[b, :, : int(k)]) for b, k in enumerate(scenes.counts)]


def set_loss(logits: torch.Tensor, boxes: torch.Tensor, scenes: td.DetectionScenes) -> torch.Tensor:
    """DETR's loss of one decoder layer's predictions: class cross-entropy over every query ("no object" weighted
    NO_OBJECT_WEIGHT), L1 and 1 - GIoU of the matched boxes, per object."""
    B, Q, n_logits = logits.shape
    matches = match(logits, boxes, scenes)
    batch = torch.cat([torch.full((len(q),), b, dtype=torch.long) for b, (q, _) in enumerate(matches)])
    query = torch.cat([torch.as_tensor(q, dtype=torch.long) for q, _ in matches])
    obj = torch.cat([torch.as_tensor(o, dtype=torch.long) for _, o in matches])
    classes = torch.full((B, Q), n_logits - 1, dtype=torch.long)  # "no object" unless matched
    classes[batch, query] = scenes.labels[batch, obj]
    weight = torch.ones(n_logits)
    weight[-1] = NO_OBJECT_WEIGHT
    class_loss = F.cross_entropy(logits.reshape(B * Q, -1), classes.reshape(-1), weight=weight)
    predicted, target = boxes[batch, query], normalised_targets(scenes)[batch, obj]  # (M, 4) each
    n_objects = max(1, len(batch))
    l1 = (predicted - target).abs().sum() / n_objects
    giou = generalized_iou(cxcywh_to_xyxy(predicted)[:, None], cxcywh_to_xyxy(target)[:, None])  # (M, 1, 1)
    giou_loss = (1 - giou).sum() / n_objects
    return CLASS_WEIGHT * class_loss + L1_WEIGHT * l1 + GIOU_WEIGHT * giou_loss


def train_detr(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the small DETR on generated scenes of shapes and write it to `out` (default ./trained/detr-tiny)."""
    recipe = DETR_RECIPE.with_steps(steps)
    out = Path(out) if out is not None else DEFAULT_OUT / NAME
    preprocessing = detr_preprocessing_from_meta(DETR_PREPROCESSING)
    with deterministic(seed, threads):
        start = time.perf_counter()
        model = DETR(DETR_CONFIG)
        stream = torch.Generator().manual_seed(td.TRAIN_STREAM_OFFSET + seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            scenes = td.make_detection_scenes(recipe.batch_size, seed, generator=stream)
            layers = decoded_layers(model, preprocessing.normalise(scenes.images))
            return torch.stack([set_loss(logits, boxes, scenes) for logits, boxes in layers]).sum()

        final_loss = optimise(model, recipe, loss_of_batch, log, NAME)
        train_seconds = time.perf_counter() - start

    meta = {
        "family": "detr",
        "name": NAME,
        "config": config_to_dict(DETR_CONFIG),
        "preprocessing": DETR_PREPROCESSING,
        "training": {
            "command": command_line(NAME, steps, seed, threads),
            "seed": seed,
            "recipe": asdict(recipe),
            "loss_weights": {
                "class": CLASS_WEIGHT,
                "l1": L1_WEIGHT,
                "giou": GIOU_WEIGHT,
                "no_object": NO_OBJECT_WEIGHT,
            },
            "final_train_loss": round(final_loss, 5),
            "train_seconds": round(train_seconds, 1),
            "environment": environment_record(threads),
            "scenes_seen": recipe.steps * recipe.batch_size,
        },
    }
    return write_run(model, out, meta, {}, evaluate_detr if evaluate else None, log)


# ---- measuring it ---------------------------------------------------------------------------------
@torch.inference_mode()
def predict(model: DETR, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class probabilities (B, Q, classes + 1), boxes (B, Q, 4) x0, y0, x1, y1 in pixels) for images
    (B, 3, H, W) in [0, 1], on the CPU."""
    if model.preprocessing is None:
        raise ValueError("this DETR has no preprocessing: load it with tc.load_model")
    x = model.preprocessing.normalise(images).to(model.device, model.dtype)
    logits, boxes = model(x)
    H, W = images.shape[-2:]
    scale = torch.tensor([W, H, W, H], dtype=torch.float32)
    return logits.float().softmax(-1).cpu(), cxcywh_to_xyxy(boxes.float().cpu()) * scale


Detection = tuple[int, float, torch.Tensor]  # class, probability, box (4,) x0, y0, x1, y1 in pixels


def detections(probs: torch.Tensor, boxes: torch.Tensor, threshold: float = THRESHOLD) -> list[Detection]:
    """One picture's detections, most probable first: (class, probability, box (4,) x0, y0, x1, y1) of each query
    whose most likely real class has at least `threshold` (what the DETR page draws). probs (Q, classes + 1)."""
    best, label = probs[:, :-1].max(-1)
    found = [(int(label[q]), float(best[q]), boxes[q]) for q in torch.nonzero(best >= threshold).flatten().tolist()]
    return sorted(found, key=lambda d: -d[1])


def _greedy(
    found: list[Detection], labels: torch.Tensor, boxes: torch.Tensor, by_class: bool
) -> list[tuple[int, int, float]]:
    """(detection, object, IoU) pairs: each detection, most probable first, takes the unmatched object (of its
    class when by_class) it overlaps most, if by at least IOU_MATCH."""
    if not found or not len(labels):
        return []
    iou = box_iou(torch.stack([d[2] for d in found]), boxes)[0]  # (detections, objects)
    taken: set[int] = set()
    pairs = []
    for i, (label, _, _) in enumerate(found):
        candidates = [j for j in range(len(labels)) if j not in taken and (not by_class or int(labels[j]) == label)]
        if candidates:
            j = max(candidates, key=lambda j: float(iou[i, j]))
            if float(iou[i, j]) >= IOU_MATCH:
                taken.add(j)
                pairs.append((i, j, float(iou[i, j])))
    return pairs


def evaluate_detr(model: DETR, log: Log = print, n: int = 2000, batch_size: int = 250) -> dict:
    """Precision and recall at IoU >= 0.5 (a detection counts when it covers an object of its class), the class
    accuracy and mean IoU of the detections that cover an object whatever their class, and the share of scenes
    the page shows exactly right, on `n` held-out scenes."""
    start = time.perf_counter()
    scenes = td.make_detection_scenes(n, EVAL_SEED)
    n_found = n_objects = true_positives = covering = right_class = all_right = 0
    ious: list[float] = []
    recall_by_count = {k: [0, 0] for k in range(1, td.MAX_OBJECTS + 1)}  # objects found, objects
    for lo in range(0, n, batch_size):
        probs, boxes = predict(model, scenes.images[lo : lo + batch_size])
        for i in range(probs.shape[0]):
            labels, truth = scenes.objects(lo + i)
            found = detections(probs[i], boxes[i])
            hits = _greedy(found, labels, truth, by_class=True)
            anywhere = _greedy(found, labels, truth, by_class=False)
            n_found += len(found)
            n_objects += len(labels)
            true_positives += len(hits)
            covering += len(anywhere)
            right_class += sum(found[d][0] == int(labels[o]) for d, o, _ in anywhere)
            ious += [iou for _, _, iou in anywhere]
            all_right += len(hits) == len(labels) == len(found)
            recall_by_count[len(labels)][0] += len(hits)
            recall_by_count[len(labels)][1] += len(labels)
    metrics = {
        "held_out_scenes": n,
        "objects": n_objects,
        "detections": n_found,
        "threshold": THRESHOLD,
        "iou_match": IOU_MATCH,
        "precision": true_positives / max(1, n_found),
        "recall": true_positives / n_objects,
        "class_accuracy_of_covering_detections": right_class / max(1, covering),
        "mean_iou_of_covering_detections": float(np.mean(ious)) if ious else 0.0,
        "scenes_exactly_right": all_right / n,
        "recall_by_objects_in_scene": {str(k): hit / max(1, total) for k, (hit, total) in recall_by_count.items()},
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"[{NAME}] precision {metrics['precision']:.3f}, recall {metrics['recall']:.3f} at IoU >= {IOU_MATCH} "
        f"(threshold {THRESHOLD}); class accuracy {metrics['class_accuracy_of_covering_detections']:.3f}, mean IoU "
        f"{metrics['mean_iou_of_covering_detections']:.3f}; {metrics['scenes_exactly_right']:.1%} of {n} held-out "
        "scenes exactly right"
    )
    return metrics
