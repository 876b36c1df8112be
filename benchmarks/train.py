"""The Train page's budget: a default training run finishes in 60 s on CI's 2-core CPU.

    python benchmarks/train.py [--device cuda]

Ours: tformer_train.classroom.train with the page's defaults (text: 2 layers, 2 heads, d_model 64, 3 epochs
over the 7,899 training sentences; image: a tiny ViT, 2 layers, 2 heads, d_model 64, patches of 2 px, 15
epochs over the 1,435 training digits), everything the page gets included: the validation accuracy and the
attention snapshot after every epoch, the test accuracy, the copy into the core's traced Encoder.
Baseline, in the same run: the same number of optimiser steps on the same batches with PyTorch's own
nn.TransformerEncoder (post-norm, ReLU, its fused fast path) and the same embedding and head, with no
snapshot, no validation and no copy: what the run would cost with nothing shown (with the same one thread).
A second run with the same seed checks the determinism (the same test accuracy and the same weights, bit for
bit); a third computes with two threads instead of one (classroom.TRAIN_THREADS), the choice it justifies.
The machine's load average is printed before and after: on shared cores, the figures follow it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
import torch.nn.functional as F
from torch import nn

from tformer_train import classroom as cr

BUDGET_S = 60.0


def baseline_text(job: cr.TextJob, device: torch.device) -> float:
    """The same steps with nn.TransformerEncoder; returns seconds."""
    tokenizer = cr.text_tokenizer()
    data = cr._text_data(tokenizer)
    layer = nn.TransformerEncoderLayer(
        job.d_model, job.n_heads, 2 * job.d_model, dropout=0.0, batch_first=True, layer_norm_eps=cr.LN_EPS
    )
    embed, encoder = (
        nn.Embedding(len(tokenizer), job.d_model),
        nn.TransformerEncoder(layer, job.n_layers, enable_nested_tensor=False),
    )
    head = nn.Linear(job.d_model, 2)
    pos = nn.Parameter(torch.zeros(cr.MAX_WORDS + 1, job.d_model))
    modules = nn.ModuleList([embed, encoder, head]).to(device)
    optimiser = torch.optim.AdamW([*modules.parameters(), pos], lr=job.lr, foreach=False)
    generator = torch.Generator().manual_seed(job.seed)
    start = time.perf_counter()
    for _ in range(job.epochs):
        order = torch.randperm(len(data.train[-1]), generator=generator)
        for s in range(0, len(order) - job.batch_size + 1, job.batch_size):
            ids, padding, labels = (t[order[s : s + job.batch_size]].to(device) for t in data.train)
            x = encoder(embed(ids) + pos[: ids.shape[1]].to(device), src_key_padding_mask=padding)
            loss = F.cross_entropy(head(torch.tanh(x[:, 0])), labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return time.perf_counter() - start


def timed(job: cr.Job, device: torch.device, threads: int = cr.TRAIN_THREADS) -> tuple[float, cr.Result]:
    start = time.perf_counter()
    result = cr.train(job, device=device, threads=threads)
    return time.perf_counter() - start, result


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, training with {cr.TRAIN_THREADS} thread(s), "
        f"device {device}, load average (1/5/15 min) before: {load()}"
    )
    text_job, image_job = cr.TextJob(), cr.ImageJob()
    ours_text, result = timed(text_job, device)
    again_text, again = timed(text_job, device)
    same = all(torch.equal(a, b) for a, b in zip(result.model.state_dict().values(), again.model.state_dict().values()))
    with cr.thread_count(cr.TRAIN_THREADS):
        base_text = baseline_text(text_job, device)
    two_threads, _ = timed(text_job, device, threads=2)
    ours_image, image_result = timed(image_job, device)
    print("| run | ours | baseline (same run) | ratio | budget |")
    print("|---|---|---|---|---|")
    verdict = "within" if max(ours_text, again_text) <= BUDGET_S else "OVER"
    print(
        f"| text classifier, defaults (3 epochs), test accuracy {result.test_accuracy:.1%} | {ours_text:.1f} s "
        f"(again: {again_text:.1f} s) | {base_text:.1f} s nn.TransformerEncoder, nothing shown | "
        f"{ours_text / base_text:.2f}x | <= {BUDGET_S:.0f} s: {verdict} |"
    )
    print(
        f"| text classifier with 2 threads instead of {cr.TRAIN_THREADS} | {two_threads:.1f} s | {ours_text:.1f} s "
        f"with {cr.TRAIN_THREADS} | {two_threads / ours_text:.2f}x | |"
    )
    verdict = "within" if ours_image <= BUDGET_S else "OVER"
    print(
        f"| tiny ViT on digits, defaults (15 epochs), test accuracy {image_result.test_accuracy:.1%} | "
        f"{ours_image:.1f} s | | | <= {BUDGET_S:.0f} s: {verdict} |"
    )
    print(
        f"determinism: the same seed gave the same weights bit for bit: {same}; test accuracy "
        f"{result.test_accuracy:.4f} and {again.test_accuracy:.4f}"
    )
    print(f"load average (1/5/15 min) after: {load()}")


if __name__ == "__main__":
    main()
