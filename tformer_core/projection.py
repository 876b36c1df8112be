"""Query–key space: one head's queries and keys in one joint PCA projection (AttentionViz, Yeh et al. 2023).

    p = qk_projection(trace, layer=2, head=5, n_components=2)
    p.queries, p.keys          # [n_q, 2], [n_k, 2]: where each query and each key lands
    p.explained                # share of the joint variance each axis keeps, decreasing, summing to <= 1

A query and a key that lie close together in the d_head-dimensional space tend to have a large dot
product, hence a large attention weight; a projection of both sets into the same axes shows which
tokens look for which. The axes are the principal components of the stacked, centred [queries; keys]:
every vector is first multiplied by sqrt(scale), scale = 1/sqrt(d_k) for most models (1 for T5), so the
dot product of a projected query and key is the softmax input q·k/sqrt(d_k) itself (before any bias and
mask), not the raw q·k.

Two translations that leave every attention weight unchanged:
- the common mean (subtracted before the PCA) is kept in `mean`: with every axis, coordinates + mean
  reproduce the vectors, so the projection keeps distances exactly and dot products after adding it back;
- `align_means=True` (AttentionViz's trick) first moves the keys by one vector so that their mean equals the
  queries' mean. Adding one vector c to every key adds q·c to every logit of query q's row, which the
  softmax cancels; without it, queries and keys often form two clusters far apart (the offset carries no
  information about which key a query prefers), and the picture shows that gap rather than the pairing.

The sign of each principal axis is fixed (its largest-magnitude entry is positive), so the same input gives
the same picture on every machine and LAPACK build. Computed in float64 with numpy; no Streamlit, no charts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace import Trace, to_host

__all__ = ["QKProjection", "project_qk", "qk_projection", "sign_fixed"]


@dataclass(frozen=True)
class QKProjection:
    """Queries and keys of one head in the same principal axes.

    queries: [n_q, n_components], keys: [n_k, n_components] coordinates. components: [n_components, d]
    orthonormal rows (the axes, in the scaled d_head space). mean: [d], the mean of the stacked (scaled,
    shifted) vectors, subtracted before projecting. key_shift: [d], added to every scaled key (zero unless
    align_means). explained: [n_components] share of the total variance along each axis (decreasing, sum
    <= 1; an axis beyond the data's rank has 0). scale: what the dot products were multiplied by
    (vectors by sqrt(scale)). Axes the data cannot fill (fewer points than axes) have zero coordinates.
    """

    queries: np.ndarray
    keys: np.ndarray
    components: np.ndarray
    mean: np.ndarray
    key_shift: np.ndarray
    explained: np.ndarray
    scale: float

    @property
    def n_components(self) -> int:
        return self.components.shape[0]

    def logits(self) -> np.ndarray:
        """[n_q, n_k] dot products of the projected queries and keys with the mean added back: with every
        axis, the softmax inputs q·k·scale (plus, with align_means, a constant per row)."""
        offset = self.mean @ self.components.T
        return (self.queries + offset) @ (self.keys + offset).T


def sign_fixed(components: np.ndarray) -> np.ndarray:
    """Each row multiplied by ±1 so that its largest-magnitude entry is positive (sklearn's svd_flip on V)."""
    components = np.asarray(components, dtype=np.float64)
    if components.size == 0:
        return components.copy()
    biggest = components[np.arange(len(components)), np.argmax(np.abs(components), axis=1)]
    return components * np.where(biggest < 0, -1.0, 1.0)[:, None]


def project_qk(
    q: np.ndarray, k: np.ndarray, n_components: int = 2, scale: float = 1.0, align_means: bool = False
) -> QKProjection:
    """q: [n_q, d], k: [n_k, d] of one head -> their joint PCA projection (see QKProjection).

    scale: multiplies every dot product (the vectors by sqrt(scale)); pass the model's 1/sqrt(d_k) for the
    softmax inputs. align_means: move the keys so their mean is the queries' (changes no attention weight).
    """
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    k = np.atleast_2d(np.asarray(k, dtype=np.float64))
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"queries and keys differ in size: d = {q.shape[1]} and {k.shape[1]}")
    if len(q) == 0 or len(k) == 0:
        raise ValueError("no queries or no keys to project")
    if n_components < 1:
        raise ValueError(f"n_components must be at least 1, got {n_components}")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale}")
    root = float(np.sqrt(scale))
    q, k = q * root, k * root
    d = q.shape[1]
    shift = q.mean(axis=0) - k.mean(axis=0) if align_means else np.zeros(d)
    k = k + shift
    stacked = np.concatenate([q, k])
    mean = stacked.mean(axis=0)
    centred = stacked - mean
    _, s, vt = np.linalg.svd(centred, full_matrices=False)  # s decreasing; rows of vt orthonormal
    kept = min(n_components, len(s))
    axes = sign_fixed(vt[:kept])
    variance = s**2
    total = variance.sum()
    explained = variance[:kept] / total if total > 0 else np.zeros(kept)
    if kept < n_components:  # fewer points (or dimensions) than axes: complete the basis, with nothing along it
        axes = np.concatenate([axes, _completion(axes, d, n_components - kept)])
        explained = np.concatenate([explained, np.zeros(n_components - kept)])
    coords = centred @ axes.T
    # An axis with no variance (beyond the data's rank) is arbitrary: its coordinates are rounding noise.
    coords[:, explained <= 1e-12] = 0.0
    n_q = len(q)
    return QKProjection(coords[:n_q], coords[n_q:], axes, mean, shift, explained, float(scale))


def _completion(axes: np.ndarray, d: int, n: int) -> np.ndarray:
    """n more unit rows orthogonal to `axes` (and to each other), from the identity, deterministically;
    zero rows where d has no room left."""
    found = list(axes)
    extra: list[np.ndarray] = []
    for e in np.eye(d):
        if len(extra) == n:
            break
        v = e - sum((e @ a) * a for a in found) if found else e.copy()
        norm = np.linalg.norm(v)
        if norm > 1e-8:
            v = sign_fixed((v / norm)[None])[0]
            found.append(v)
            extra.append(v)
    extra += [np.zeros(d)] * (n - len(extra))
    return np.asarray(extra).reshape(n, d)


def qk_projection(
    trace: Trace,
    layer: int,
    head: int,
    stack: str | None = None,
    n_components: int = 2,
    align_means: bool = False,
    queries: np.ndarray | None = None,
    keys: np.ndarray | None = None,
) -> QKProjection:
    """The joint projection of one head's queries and keys from a trace, scaled by the model's 1/sqrt(d_k).

    Cross-attention (stack "cross"): queries of the decoder positions, keys of the encoder's tokens.
    Grouped-query attention: the keys are those of the key/value head the query head reads.
    queries, keys: positions to keep (e.g. without special tokens); the PCA is fitted on those only.
    Raises KeyError when the trace holds no queries and keys (a model run by transformers' own code).
    """
    parts = [trace.block_tensor(part, layer, head, stack) for part in ("q", "k")]
    q, k = (np.asarray(a, dtype=np.float64) for a in to_host(parts))  # one transfer
    if queries is not None:
        q = q[np.asarray(queries, dtype=np.int64)]
    if keys is not None:
        k = k[np.asarray(keys, dtype=np.int64)]
    scale = trace.meta.attention_scale
    return project_qk(q, k, n_components, scale=scale, align_means=align_means)
