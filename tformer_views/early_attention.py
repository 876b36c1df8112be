"""What the "Attention before Transformers" page shows, from the core's numbers (no Streamlit).

score_table(tc.scores.score_functions(a, b))      # one row per score function: formula, steps, value
pooled = compare_pooling(attention_model, mean_model, "a gorgeous, witty film")
pooled.frame()                                    # per word: alpha under attention, 1/n under the mean
a = rnn_alignment(rnn_model.trace(sentence))      # alpha [output step, source word], rows by the word made
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import PoolingModel
from tformer_core.scores import ScoreSteps
from tformer_core.trace import Trace, to_host

from .charts.spec import channel, fitting, layered, named_data, unique_labels
from .text import HeadMatrix
from .tokens import display_tokens

__all__ = [
    "PoolingComparison",
    "argmax_agreement",
    "compare_pooling",
    "pooling_input",
    "rnn_alignment",
    "score_table",
    "weights_chart",
]


# ---- score functions -----------------------------------------------------------------------------
def _numbers(value: np.ndarray | float) -> str:
    if isinstance(value, np.ndarray):
        return "[" + ", ".join(f"{x:.4g}" for x in value.ravel()) + "]"
    return f"{value:.4g}"


def score_table(steps: Sequence[ScoreSteps]) -> pd.DataFrame:
    """function, formula, the intermediate numbers ("name = value; ..."), the score."""
    return pd.DataFrame(
        [
            {
                "function": s.name,
                "formula": s.formula,
                "steps": "; ".join(f"{k} = {_numbers(v)}" for k, v in s.parts.items()),
                "score": s.value,
            }
            for s in steps
        ]
    ).set_index("function")


# ---- attention pooling vs mean pooling -----------------------------------------------------------
@dataclass(frozen=True)
class PoolingComparison:
    """One sentence through both sentiment models: the words, each model's weights and prediction."""

    words: tuple[str, ...]
    attention_weights: np.ndarray  # [words], sums to 1
    attention_scores: np.ndarray  # [words], s_j before the softmax
    mean_weights: np.ndarray  # [words], 1/n each
    attention_prediction: list[tuple[str, float]]
    mean_prediction: list[tuple[str, float]]
    unknown: tuple[str, ...]

    def frame(self) -> pd.DataFrame:
        """One row per word: its score s_j and weight alpha_j under attention pooling, 1/n under mean pooling."""
        return pd.DataFrame(
            {
                "word": list(self.words),
                "score s_j": self.attention_scores,
                "alpha_j (attention)": self.attention_weights,
                "1/n (mean)": self.mean_weights,
            }
        ).rename_axis("position")


def pooling_input(model: TracedModel[Any], text: str) -> str:
    """The words a sentiment model reads of `text`, joined (cut to the words it reads at most); ValueError for
    a text without a single word."""
    if not isinstance(model, PoolingModel):
        raise InputError(f"this section shows attention pooling over words, not a {model.kind} model")
    words = model.words(text)
    if not words:
        raise InputError("the sentence has no words (letters or digits): type a sentence")
    return " ".join(words[: model.max_tokens])


def compare_pooling(att: Trace, mean: Trace, unknown: Sequence[str] = ()) -> PoolingComparison:
    """The traces of one sentence through the attention-pooling and the mean-pooling model, side by side."""
    weights, scores = att.fetch("pool.weights", "pool.word_scores")
    return PoolingComparison(
        tuple(display_tokens(att.tokens)),
        np.asarray(weights, dtype=np.float64),
        np.asarray(scores, dtype=np.float64),
        np.asarray(mean["pool.weights"], dtype=np.float64),
        att.predictions(2),
        mean.predictions(2),
        tuple(unknown),
    )


def weights_chart(p: PoolingComparison, width: int = 640) -> dict:
    """Bars of alpha_j per word (attention pooling), with the mean's 1/n as a dashed rule across them."""
    words = unique_labels(p.words)
    frame = pd.DataFrame({"word": words, "alpha": p.attention_weights, "score": p.attention_scores})
    datasets: dict = {}
    x = channel("word", "ordinal", title=None, sort=list(words), axis={"labelAngle": -45})
    bars = {
        "data": named_data(frame, datasets),
        "mark": {"type": "bar"},
        "encoding": {
            "x": x,
            "y": channel("alpha", "quantitative", title="weight α_j"),
            "tooltip": [
                channel("word", "nominal"),
                channel("alpha", "quantitative", format=".4f"),
                channel("score", "quantitative", title="score s_j", format=".4f"),
            ],
        },
    }
    uniform = pd.DataFrame({"alpha": [float(p.mean_weights[0])]})
    rule = {
        "data": named_data(uniform, datasets),
        "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"},
        "encoding": {"y": channel("alpha", "quantitative")},
    }
    return fitting(layered([bars, rule], datasets, "α over the words (dashed: mean pooling's 1/n)", height=180), width)


# ---- RNN alignment -----------------------------------------------------------------------------
def rnn_alignment(trace: Trace) -> HeadMatrix:
    """alpha [output steps, source words] of an RNN encoder-decoder's trace, rows labelled by the word each
    step made (its most likely word: the greedy output, then <eos>)."""
    # The word each step made is picked where the logits are: [M] ids and alpha cross to the host together.
    weights, made = to_host([trace.tensor("attn.weights"), trace.tensor("head.logits").argmax(-1)])
    alpha = np.asarray(weights, dtype=np.float64)  # [M, J]
    labels = trace.meta.labels
    rows = tuple(display_tokens([str(labels[i]) if labels is not None else str(i) for i in made]))
    cols = tuple(display_tokens(trace.tokens))
    return HeadMatrix(
        alpha, np.arange(alpha.shape[0]), np.arange(alpha.shape[1]), rows, cols, None, np.zeros(alpha.shape[0])
    )


def argmax_agreement(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(rows where both matrices put their largest weight on the same column, rows compared)."""
    n = min(a.shape[0], b.shape[0])
    return int((a[:n].argmax(-1) == b[:n].argmax(-1)).sum()), n
