"""LayerNorm, RMSNorm, the feed-forward network and the patch embedding as worked examples
(tformer_core.block_steps): numbers worked by hand, and parity with torch and the core's own modules."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tformer_core as tc
from tformer_core.models.layers import BlockConfig, FeedForward, make_norm, patchify

# The lecture's patch-embedding example: an 8 x 8 image with values 0..4, patch size 4, two 4 x 4 kernels.
LECTURE_IMAGE = np.array(
    [
        [1, 2, 4, 2, 2, 3, 3, 2],
        [1, 0, 2, 1, 2, 1, 1, 1],
        [2, 2, 3, 4, 3, 4, 1, 3],
        [2, 1, 3, 0, 0, 2, 3, 0],
        [3, 3, 4, 0, 2, 0, 2, 2],
        [1, 4, 4, 3, 4, 0, 4, 0],
        [1, 2, 0, 0, 0, 3, 2, 3],
        [4, 1, 4, 1, 0, 0, 0, 0],
    ]
)
LECTURE_KERNELS = np.array(
    [[[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 0, 1], [1, 1, 0, 1]], [[1, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]]]
)


# ---- patch embedding -----------------------------------------------------------------------------------
def test_the_lecture_patch_embeddings():
    steps = tc.patch_embedding_steps(LECTURE_IMAGE, LECTURE_KERNELS, 4)
    assert steps.grid_hw == (2, 2)
    np.testing.assert_array_equal(steps.output, [[14, 10], [14, 12], [18, 17], [11, 9]])
    # Row-major patches: patch 1 is the top-right 4 x 4 block, flattened row by row.
    np.testing.assert_array_equal(steps.patches[1], LECTURE_IMAGE[:4, 4:].reshape(-1))
    np.testing.assert_array_equal(steps.patches[2], LECTURE_IMAGE[4:, :4].reshape(-1))
    # The products of kernel 1 over patch 0, summed by hand: 1+2+0+2+0+0+2+0+2+0+0+0+2+1+0+0 ... = 14.
    assert steps.products(0, 0).sum() == 14 and steps.products(3, 1).sum() == 9
    np.testing.assert_array_equal(steps.weight[:, 1], LECTURE_KERNELS[1].reshape(-1))


def test_patch_embedding_is_a_stride_p_convolution():
    rng = np.random.default_rng(0)
    image, kernels, bias = rng.normal(size=(3, 12, 8)), rng.normal(size=(5, 3, 4, 4)), rng.normal(size=5)
    steps = tc.patch_embedding_steps(image, kernels, 4, bias)
    conv = F.conv2d(torch.from_numpy(image)[None], torch.from_numpy(kernels), torch.from_numpy(bias), stride=4)
    assert conv.shape == (1, 5, 3, 2) and steps.grid_hw == (3, 2)
    np.testing.assert_allclose(steps.output, conv[0].flatten(1).T.numpy(), atol=1e-12)  # [N, D], row-major
    # The same patches as the models' own patchify, and back to the image.
    np.testing.assert_array_equal(steps.patches, patchify(torch.from_numpy(image)[None], 4)[0].numpy())
    np.testing.assert_array_equal(tc.block_steps.unpatchify(steps.patches, (3, 2), 4, 3), image)


def test_patch_embedding_equals_the_vit_layer():
    model = tc.load_model("vit-tiny", device="cpu")
    image = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(1))
    trace = model.trace(image)
    project = model.encoder.embed.project
    kernels = project.weight.detach().double().reshape(64, 3, 4, 4).numpy()
    steps = tc.patch_embedding_steps(image.double().numpy(), kernels, 4, project.bias.detach().double().numpy())
    np.testing.assert_allclose(steps.output, trace["encoder.embed.patch"], atol=1e-5)
    np.testing.assert_allclose(steps.patches, trace["encoder.embed.patches"], atol=1e-6)


@pytest.mark.parametrize(
    "image, kernels, p, message",
    [
        (
            np.ones((8, 8)),
            np.ones((2, 3, 3)),
            3,
            "a patch size of 3 does not divide the 8 × 8 image: H and W must be multiples of 3",
        ),
        (np.ones((8, 8)), np.ones((2, 4, 4)), 2, "each kernel must be 2 × 2 (the patch size), got 4 × 4"),
        (np.ones((3, 8, 8)), np.ones((2, 4, 4)), 4, "the kernels have 1 channels but the image has 3"),
        (np.ones((8, 8)), np.ones((2, 4, 4)), 0, "the patch size must be a whole number ≥ 1, got 0"),
        ([[1, "a"], [2, 3]], np.ones((1, 2, 2)), 2, "image must hold numbers only"),
        (np.full((4, 4), np.nan), np.ones((1, 2, 2)), 2, "image[0, 0] is not a finite number"),
    ],
)
def test_patch_embedding_refuses_what_does_not_fit(image, kernels, p, message):
    with pytest.raises(tc.InputError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        tc.patch_embedding_steps(image, kernels, p)


# ---- LayerNorm and RMSNorm ---------------------------------------------------------------------------------
def test_layer_norm_by_hand():
    ln = tc.layer_norm_steps([[1, 5, 1, 5], [2, 4, 6, 8]], gamma=[1, 1, 2, 0.5], beta=[0, 0, 1, -1], eps=1e-5)
    np.testing.assert_array_equal(ln.mean, [3, 5])
    np.testing.assert_array_equal(ln.var, [4, 5])  # divided by d = 4, not d - 1
    np.testing.assert_allclose(ln.normalized[0], np.array([-1, 1, -1, 1]) * 2 / math.sqrt(4 + 1e-5))
    np.testing.assert_allclose(ln.output[0], ln.normalized[0] * [1, 1, 2, 0.5] + [0, 0, 1, -1])
    # Whatever γ and β, x̂ has mean 0 and (up to ε) variance 1 on every row.
    np.testing.assert_allclose(ln.normalized.mean(axis=1), 0, atol=1e-15)
    np.testing.assert_allclose(ln.normalized.var(axis=1), ln.var / (ln.var + 1e-5))


@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.5])
def test_layer_norm_matches_torch(eps):
    rng = np.random.default_rng(3)
    x, gamma, beta = rng.normal(size=(6, 16)) * 3 + 1, rng.normal(size=16), rng.normal(size=16)
    ln = torch.nn.LayerNorm(16, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(torch.from_numpy(gamma))
        ln.bias.copy_(torch.from_numpy(beta))
        expected = ln(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(tc.layer_norm_steps(x, gamma, beta, eps).output, expected, atol=1e-12)
    np.testing.assert_allclose(
        tc.layer_norm_steps(x, eps=eps).output, F.layer_norm(torch.from_numpy(x), (16,), eps=eps)
    )


def test_rms_norm_by_hand_and_against_the_core_norm():
    rms = tc.rms_norm_steps([3.0, 4.0], gamma=[2.0, 1.0], eps=1e-6)
    assert rms.x.shape == (1, 2)
    np.testing.assert_allclose(rms.rms, [math.sqrt(12.5 + 1e-6)])
    np.testing.assert_allclose(rms.output, [[6 / math.sqrt(12.5 + 1e-6), 4 / math.sqrt(12.5 + 1e-6)]])
    norm = make_norm(BlockConfig(d_model=16, n_heads=4, norm_type="rmsnorm", ln_eps=1e-6)).double()
    x, gamma = np.random.default_rng(4).normal(size=(5, 16)), np.linspace(0.5, 2.0, 16)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(gamma))
        expected = norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(tc.rms_norm_steps(x, gamma, 1e-6).output, expected, atol=1e-12)


@pytest.mark.parametrize(
    "eps, message",
    [
        (0, r"^eps must be a positive number \(it keeps the division away from 0\), got 0$"),
        (-1e-5, r"^eps must be a positive number \(it keeps the division away from 0\), got -1e-05$"),
        (float("nan"), r"^eps must be a positive number \(it keeps the division away from 0\), got nan$"),
        ("small", "^eps must be a number, got 'small'$"),
    ],
)
def test_norms_refuse_an_eps_that_is_not_positive(eps, message):
    with pytest.raises(tc.InputError, match=message):
        tc.layer_norm_steps([[1.0, 2.0]], eps=eps)
    with pytest.raises(tc.InputError, match=message):
        tc.rms_norm_steps([[1.0, 2.0]], eps=eps)


def test_norms_refuse_parameters_of_the_wrong_size():
    with pytest.raises(tc.InputError, match="gamma has 3 numbers but x has 4 dimensions"):
        tc.layer_norm_steps(np.ones((2, 4)), gamma=[1, 1, 1])
    with pytest.raises(tc.InputError, match="beta has 5 numbers but x has 4 dimensions"):
        tc.layer_norm_steps(np.ones((2, 4)), beta=np.ones(5))
    with pytest.raises(tc.InputError, match=r"^x\[1, 0\] is not a finite number$"):
        tc.layer_norm_steps([[1.0, 2.0], [np.inf, 0.0]])


# ---- the feed-forward network -------------------------------------------------------------------------------
def test_ffn_by_hand_with_relu():
    x = [[1.0, -1.0]]
    W1, b1 = [[1.0, 0.0, 2.0], [1.0, 1.0, -1.0]], [0.0, 0.5, -4.0]
    W2, b2 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [0.5, 0.0]
    ffn = tc.ffn_steps(x, W1, b1, W2, b2, "relu")
    np.testing.assert_array_equal(ffn.hidden_pre, [[2 - 2, -1 + 0.5, 2 + 1 - 4]])  # [0, -0.5, -1]
    np.testing.assert_array_equal(ffn.hidden, [[0, 0, 0]])
    np.testing.assert_array_equal(ffn.output, [b2])  # nothing gets through: only b2 is left
    np.testing.assert_array_equal(ffn.active, [0])
    ffn = tc.ffn_steps([[2.0, 1.0]], W1, b1, W2, b2, "relu")
    np.testing.assert_array_equal(ffn.hidden_pre, [[3, 1.5, -1]])
    np.testing.assert_array_equal(ffn.output, [[3 + 0.5, 1.5]])
    np.testing.assert_array_equal(ffn.active, [2])


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("gated", [False, True])
def test_ffn_matches_a_hand_built_torch_ffn_and_the_core_module(activation, gated):
    torch.manual_seed(0)
    module = FeedForward(8, 32, activation, gated=gated).double()
    x = torch.randn(5, 8, dtype=torch.float64)

    def weights(linear):
        return linear.weight.detach().T.numpy(), linear.bias.detach().numpy()

    gate = {}
    if gated:
        Wg, bg = weights(module.W_gate)
        gate = {"W_gate": Wg, "b_gate": bg}
    steps = tc.ffn_steps(x.numpy(), *weights(module.W_in), *weights(module.W_out), activation, **gate)
    with torch.no_grad():
        np.testing.assert_allclose(steps.output, module(x).numpy(), atol=1e-12)
        # By hand, layer by layer: torch.nn.Linear, the activation, torch.nn.Linear.
        first = torch.nn.Linear(8, 32, dtype=torch.float64)
        first.load_state_dict(module.W_in.state_dict())
        pre = first(x)
        np.testing.assert_allclose(steps.hidden_pre, pre.numpy(), atol=1e-12)
        act = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
        hidden = act[activation](module.W_gate(x)) * pre if gated else act[activation](pre)
        np.testing.assert_allclose(steps.hidden, hidden.numpy(), atol=1e-12)


def test_exact_gelu_is_not_the_tanh_one_and_lets_small_negatives_through():
    h = np.array([[-3.0, -0.5, 0.0, 1.0]])
    exact = tc.block_steps.activate(h, "gelu")
    np.testing.assert_allclose(exact, h * 0.5 * (1 + np.vectorize(math.erf)(h / math.sqrt(2))), atol=1e-15)
    assert exact[0, 1] < 0 and abs(exact[0, 1] - tc.block_steps.activate(h, "gelu_tanh")[0, 1]) > 1e-6


def test_ffn_refuses_shapes_that_do_not_fit():
    with pytest.raises(tc.InputError, match="W1 is 3 × 4 but the input has 2 columns: needs 2 rows"):
        tc.ffn_steps(np.ones((1, 2)), np.ones((3, 4)), None, np.ones((4, 2)), None)
    with pytest.raises(tc.InputError, match="W2 is 3 × 2 but the input has 4 columns: needs 4 rows"):
        tc.ffn_steps(np.ones((1, 2)), np.ones((2, 4)), None, np.ones((3, 2)), None)
    with pytest.raises(tc.InputError, match="b1 has 3 numbers but W1 has 4 columns: one per column"):
        tc.ffn_steps(np.ones((1, 2)), np.ones((2, 4)), np.ones(3), np.ones((4, 2)), None)
    with pytest.raises(
        tc.InputError, match=r"^activation must be one of \('relu', 'gelu', 'gelu_tanh', 'silu'\), got 'tanh'$"
    ):
        tc.ffn_steps(np.ones((1, 2)), np.ones((2, 4)), None, np.ones((4, 2)), None, "tanh")
