"""What a request will compute, estimated before it runs (tformer_core.workload): against the matrix products the
work really runs (counted under a dispatch mode), the rows it really runs, and numbers worked by hand."""

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tformer_core import patching, probes, workload
from tformer_core.errors import InputError

from .tiny_models import D, H, image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit


class MatmulCount(TorchDispatchMode):
    """Floating-point operations of every matrix product run inside the block (2 per multiply-add): what the
    estimate claims to count, measured on the operations torch dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.linear.default:
            x, weight = args[0], args[1]
            self.flops += 2 * math.prod(x.shape[:-1]) * weight.shape[0] * weight.shape[1]
        elif func is torch.ops.aten.matmul.default:
            self.flops += 2 * math.prod(out.shape) * args[0].shape[-1]
        return out


def test_a_layers_cost_per_token_is_two_operations_a_weight_plus_the_attentions_products():
    model = tiny_encoder()  # d_model 16, 4 heads of 4, d_ff 32, biases: Q, K, V, O 16 x 16 and the FFN 16 x 32 x 2
    weights = 4 * D * D + 2 * D * 32
    for tokens in (1, 7):
        # QKᵀ: each query a dot product of width 16 with every key; weights x V: the same again; 2 a multiply-add.
        assert workload.layer_flops(model, "encoder", tokens) == 2 * weights + 4 * tokens * H * (D // H)
    assert workload.stack_layers(model, "encoder") == 2
    with pytest.raises(ValueError, match=r"^this model has no stack of blocks named 'decoder'$"):
        workload.layer_flops(model, "decoder", 3)


@pytest.mark.parametrize("kind", ["next token", "similarity", "translation", "class"])
def test_a_studys_estimate_counts_the_rows_it_runs_and_its_matrix_products_within_ten_percent(kind):
    if kind == "next token":
        model = tiny_decoder()
        probe = probes.next_token_probe(model, list(range(1, 20)))
        cost = probes.head_importance_workload(model, probe.heads, probe.tokens)
    elif kind == "similarity":  # two sentences: the estimate runs them as one (their attention a little more)
        model = tiny_encoder()
        probe = probes.similarity_probe(model, [1, 2, 3, 4, 5], [6, 7, 8, 9])
        cost = probes.head_importance_workload(model, probe.heads, probe.tokens)
    elif kind == "translation":
        model = tiny_seq2seq()
        probe = probes.translation_probe(model, [1, 2, 3, 4, 5, 6], [1], token=3)
        cost = probes.head_importance_workload(model, probe.heads, 7, {"encoder": 6, "decoder": 1})
    else:
        model = tiny_vit()
        probe = probes.class_probe(model, image(), class_id=2)
        cost = probes.head_importance_workload(model, probe.heads, probe.tokens)
    with MatmulCount() as counted:
        result = probes.head_importance(probe)
    assert cost.rows == result.rows
    assert cost.flops == pytest.approx(counted.flops, rel=0.10)
    if kind == "next token":  # one stack, one length: every product is counted, exactly
        assert cost.flops == counted.flops


def test_a_patching_grids_estimate_counts_its_rows_and_its_matrix_products():
    model = tiny_decoder()
    a, b = list(range(1, 10)), list(range(2, 11))
    cost = patching.patching_workload(model, len(a))
    with MatmulCount() as counted:
        grid = patching.residual_patching(model, a, b)
    assert cost.rows == grid.rows + 2  # B traced and A run once besides the patched rows
    assert cost.flops == pytest.approx(counted.flops, rel=0.02)


def test_the_longest_input_within_a_limit_is_found_and_the_refusal_says_what_fits():
    model = tiny_decoder()
    heads = {"decoder": (2, H)}
    cost = lambda n: probes.head_importance_workload(model, heads, n)  # noqa: E731
    limit = cost(12).flops
    assert workload.longest(cost, limit, 32) == 12
    assert workload.longest(cost, limit - 1, 32) == 11
    assert workload.longest(cost, cost(1).flops / 2, 32) == 0
    assert workload.longest(cost, limit, 5) == 5  # never more than the input has
    workload.check(cost(12), limit, "TFORMER_REQUEST_GFLOP")  # within: nothing raised
    with pytest.raises(workload.TooMuchWork) as refused:
        workload.check(cost(20), limit, "TFORMER_REQUEST_GFLOP", "a text of at most 12 tokens (this one has 20)")
    message = str(refused.value)
    assert isinstance(refused.value, InputError)  # the page tells it as the input's problem, with what fits
    assert "Ablating every head would run 9 batch rows of 20 tokens through up to 2 layers" in message
    assert "TFORMER_REQUEST_GFLOP" in message and "A text of at most 12 tokens (this one has 20) fits." in message


def test_an_estimate_grows_with_the_tokens_and_with_the_square_of_them_in_the_attention():
    model = tiny_decoder()
    one, two = (workload.layer_flops(model, "decoder", n) for n in (10, 20))
    assert two - one == 4 * 10 * H * (D // H)  # the attention's part doubles with the keys; the weights' stays
    costs = [probes.head_importance_workload(model, {"decoder": (2, H)}, n).flops for n in range(1, 40)]
    assert np.all(np.diff(costs) > 0)
