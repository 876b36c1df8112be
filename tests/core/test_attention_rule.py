"""The attention rule, written once (tformer_core.attention) and used by the model, traces and lessons."""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tformer_core as tc
from tformer_core.attention import attend, attend_float64, attention_logits, attention_weights, grouped_matmul

ROOT = Path(__file__).resolve().parents[2]


def test_a_worked_example_with_scale_bias_mask_and_a_query_that_sees_nothing():
    q = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)  # [1 head, 2 queries, d 2]
    k = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)  # [1, 3 keys, 2]
    scores = grouped_matmul(q, k.transpose(-2, -1))
    assert scores.tolist() == [[[2.0, 0.0, 1.0], [0.0, 2.0, 2.0]]]
    bias = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    allowed = torch.tensor([[True, True, False], [False, False, False]])
    logits = attention_logits(scores, 0.5, bias, allowed)
    assert logits[0, 0].tolist() == [1.0, 1.0, float("-inf")]  # 2 * 0.5, 0 * 0.5 + 1, masked
    weights = attention_weights(logits, allowed)
    assert weights[0, 0].tolist() == [0.5, 0.5, 0.0]
    assert weights[0, 1].tolist() == [0.0, 0.0, 0.0]  # may attend to nothing: 0, not NaN


def test_grouped_query_heads_read_their_key_value_head_as_pytorch_does():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 5, 4, generator=g),
        torch.randn(2, 2, 7, 4, generator=g),
        torch.randn(2, 2, 7, 3, generator=g),
    )
    allowed = torch.rand(5, 7, generator=g) > 0.3
    allowed[:, 0] = True
    ours = attend(q, k, v, 0.5, allowed=allowed)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.5, enable_gqa=True)
    torch.testing.assert_close(ours.z, theirs)
    expanded = k.repeat_interleave(3, dim=1)  # query head i reads key/value head i // 3
    torch.testing.assert_close(ours.scores, q @ expanded.transpose(-2, -1))


def test_the_float64_rule_is_the_same_rule():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(4, 3, 8)), rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8))
    exact = attend_float64(q, k, v, 8**-0.5, allowed=np.tril(np.ones((3, 5), dtype=bool), k=2))
    assert exact.weights.dtype == np.float64 and exact.z.shape == (4, 3, 8)
    np.testing.assert_allclose(exact.weights.sum(-1), 1.0, atol=1e-15)
    ours = attend(
        *(torch.from_numpy(a).float() for a in (q, k, v)),
        8**-0.5,
        None,
        torch.from_numpy(np.tril(np.ones((3, 5), dtype=bool), k=2)),
    )
    np.testing.assert_allclose(exact.weights, ours.weights.double().numpy(), atol=1e-6)


def test_the_relative_bias_belongs_to_self_attention_only():
    torch.manual_seed(0)
    config = tc.Seq2SeqConfig(
        src_vocab_size=20,
        tgt_vocab_size=20,
        d_model=16,
        n_heads=2,
        d_ff=32,
        rel_pos_buckets=8,
        positional="none",
        scale_attention=False,
        norm="pre",
        norm_type="rmsnorm",
        bias=False,
    )
    trace = tc.EncoderDecoder(config).trace([3, 4, 5, 6], [1, 7, 8])
    np.testing.assert_array_equal(trace.attention_bias(1, stack="encoder"), trace["encoder.position_bias"])
    np.testing.assert_array_equal(trace.attention_bias(0, 1, stack="decoder"), trace["decoder.position_bias"][1])
    assert trace.attention_bias(0, stack="cross") is None
    assert tc.Encoder(tc.EncoderConfig(vocab_size=20)).trace([1, 2]).attention_bias(0) is None
    # The recomputed weights of every block are the stored ones: the trace adds the bias where the model does.
    for stack in trace.attention_stacks:
        stored = trace.activations[tc.trace.ATTENTION_STACKS[stack].format(layer=0) + ".weights"]
        recomputed = trace.compact().attention(0, stack=stack)
        np.testing.assert_allclose(recomputed, stored, atol=1e-6)


# Where attention used to be written out again; each now calls tformer_core.attention.
USERS = [
    "tformer_core/models/layers.py",
    "tformer_core/trace.py",
    "tformer_core/steps.py",
    "tformer_views/why.py",
    "tformer_views/lessons/block.py",
    # attention before Transformers: their own score functions (tformer_core.scores), the rule's mask and softmax
    "tformer_core/models/pooling.py",
    "tformer_core/models/rnn.py",
    "tformer_core/scores.py",
]
# Families whose attention is the core's own modules (MultiHeadAttention, in blocks or stacks): nothing of the
# rule written again in them.
MODULE_USERS = ["tformer_core/models/detr.py", "tformer_core/models/mae.py"]


@pytest.mark.parametrize("path", USERS)
def test_no_copy_of_the_rule_is_left(path):
    tree = ast.parse((ROOT / path).read_text())
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    methods = {f.attr for f in calls if isinstance(f, ast.Attribute)}
    assert not methods & {"softmax", "masked_fill", "repeat_interleave", "repeat"}, path
    if path != "tformer_core/trace.py":  # which takes numerics.softmax of a vocabulary's logits, not of attention
        assert "softmax" not in {f.id for f in calls if isinstance(f, ast.Name)}, path
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imported & {"attention_logits", "attention_weights", "grouped_matmul", "attend", "attend_float64"}, path


@pytest.mark.parametrize("path", MODULE_USERS)
def test_families_built_on_the_cores_attention_write_none_of_it_again(path):
    tree = ast.parse((ROOT / path).read_text())
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None) for f in calls}
    assert not names & {"softmax", "masked_fill", "repeat_interleave", "attention_logits", "attention_weights"}, path
    matmuls = [node for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)]
    assert not matmuls, path  # no Q K^T or weights V of their own
    assert names & {"MultiHeadAttention", "Stack"}, path


def test_a_heads_logits_become_the_scores_shown_by_one_rule():
    from tformer_core.numerics import head_scores

    np.testing.assert_allclose(head_scores([0.0, np.log(3.0)]), [0.25, 0.75])
    np.testing.assert_allclose(head_scores([0.0, np.log(3.0)], "sigmoid"), [0.5, 0.75])
    np.testing.assert_array_equal(head_scores([1.5, -2.0], "none"), [1.5, -2.0])
    with pytest.raises(ValueError, match=r"^scores are one of \('softmax', 'sigmoid', 'none'\), not 'tanh'$"):
        head_scores([1.0], "tanh")
