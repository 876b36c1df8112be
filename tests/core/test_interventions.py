"""Interventions through the hook points: ablating, scaling and patching, per call, on every model kind."""

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import D, H, _seeded, image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.interventions import (
    Edit,
    Head,
    HookNameError,
    ablate_heads,
    branch,
    check_names,
    closest_names,
    intervene,
    patch,
    scale_heads,
)

A = [3, 7, 1, 12, 9, 4]
B = [5, 2, 8, 11, 6, 13]
TGT = [1, 5, 9, 2, 17]


def tiny_llama():
    return _seeded(
        lambda: tc.Llama(
            tc.LlamaConfig(vocab_size=40, max_positions=32, n_layers=2, d_model=D, n_heads=H, n_kv_heads=2, d_ff=32)
        )
    )


# kind -> (model builder (float64), run on input "a" or "b" returning the output tensor, trace of input a or b)
KINDS = {
    "encoder": (lambda: tiny_encoder().double(), lambda m, x: m(torch.tensor([x]))),
    "encoder-pre": (lambda: tiny_encoder(norm="pre").double(), lambda m, x: m(torch.tensor([x]))),
    "gpt2": (lambda: tiny_decoder().double(), lambda m, x: m(torch.tensor([x]))),
    "llama": (lambda: tiny_llama().double(), lambda m, x: m(torch.tensor([x]))),
    "seq2seq": (lambda: tiny_seq2seq().double(), lambda m, x: m(torch.tensor([x]), torch.tensor([TGT]))),
    "vit": (lambda: tiny_vit().double(), lambda m, x: m(x[None])),
}
INPUTS = {"vit": (image(0).double(), image(1).double())}
# The attention stacks whose heads each kind's tests ablate.
STACKS = {"seq2seq": ("encoder", "decoder", "cross"), "gpt2": ("decoder",), "llama": ("decoder",)}


def _inputs(kind):
    return INPUTS.get(kind, (A, B))


def _run(kind, model, x):
    with torch.inference_mode():
        return KINDS[kind][1](model, x)


def _attn_module(model, head):
    root = model.decoder if head.stack in ("decoder", "cross") else model.encoder
    block = root.blocks[head.layer]
    return block.cross_attn if head.stack == "cross" else block.attn


@pytest.mark.parametrize("kind", KINDS)
def test_ablating_nothing_changes_nothing_bit_for_bit(kind):
    model = KINDS[kind][0]()
    x = _inputs(kind)[0]
    plain = _run(kind, model, x)
    with intervene(ablate_heads([])):
        same = _run(kind, model, x)
    with intervene([scale_heads(Head(STACKS.get(kind, ("encoder",))[0], 0, 0).block, torch.ones(H))]):
        scaled_by_one = _run(kind, model, x)
    assert torch.equal(plain, same) and torch.equal(plain, scaled_by_one)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_ablating_a_head_equals_a_model_whose_w_o_ignores_it(kind):
    """Every stack of the kind: the ablated pass equals a copy of the model with that head's W_O columns zero."""
    model = KINDS[kind][0]()
    x = _inputs(kind)[0]
    plain = _run(kind, model, x)
    dh = D // H
    for stack in STACKS.get(kind, ("encoder",)):
        head = Head(stack, 1, 2)
        with intervene(ablate_heads([head])):
            ablated = _run(kind, model, x)
        hand = copy.deepcopy(model)
        with torch.no_grad():
            _attn_module(hand, head).W_o.weight[:, 2 * dh : 3 * dh] = 0.0  # concat(z) W_o^T: head 2's columns
        expected = _run(kind, hand, x)
        torch.testing.assert_close(ablated, expected, rtol=1e-12, atol=1e-12)
        assert (ablated - plain).abs().max() > 1e-6, f"ablating {head} must change the output"


@pytest.mark.parametrize("kind", ["gpt2", "vit"])
def test_a_trace_under_an_ablation_records_the_edited_head_and_the_model_is_untouched(kind):
    model = KINDS[kind][0]()
    x = _inputs(kind)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace = lambda: model.trace(x)  # noqa: E731
    clean = trace()
    stack = STACKS.get(kind, ("encoder",))[0]
    with intervene(ablate_heads([Head(stack, 0, 1)], how="mean")):
        edited = trace()
    z, z0 = edited.block("z", 0, stack=stack), clean.block("z", 0, stack=stack)
    np.testing.assert_allclose(z[1], np.broadcast_to(z0[1].mean(axis=0), z0[1].shape), atol=1e-12)
    np.testing.assert_array_equal(z[0], z0[0])  # the other heads of that layer as they were
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    np.testing.assert_array_equal(trace().output, clean.output)  # nothing left behind after the block


def test_scaling_a_head_scales_its_share_of_the_attention_output():
    model = KINDS["gpt2"][0]()
    w = model.weights().block(0).attn
    clean = model.trace(A)
    with intervene(ablate_heads([Head("decoder", 0, 3)], factor=2.0)):
        doubled = model.trace(A)
    head_share = clean.block("z", 0, 3) @ w.W_O[3].numpy()  # [T, D]
    np.testing.assert_allclose(doubled["decoder.0.attn.out"], clean["decoder.0.attn.out"] + head_share, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_patching_every_layers_residual_from_b_reproduces_bs_output(kind):
    model = KINDS[kind][0]()
    a, b = _inputs(kind)
    trace_b = model.trace(b) if kind != "seq2seq" else model.trace(b, TGT)
    stack = "decoder" if kind in ("gpt2", "llama", "seq2seq") else "encoder"
    edits = [patch(f"{stack}.{layer}.resid_pre", trace_b) for layer in range(trace_b.layers_in(stack))]
    if kind == "seq2seq":  # the decoder reads the encoder's output too: patch that as well
        edits.append(patch("encoder.out", trace_b))
    with intervene(edits):
        patched = _run(kind, model, a)
    torch.testing.assert_close(patched, _run(kind, model, b), rtol=1e-12, atol=1e-12)
    assert (_run(kind, model, a) - _run(kind, model, b)).abs().max() > 1e-6


def test_patching_positions_moves_one_token_of_the_residual_stream():
    model = KINDS["gpt2"][0]()
    trace_b = model.trace(B)
    with intervene([patch("decoder.1.resid_pre", trace_b, {2: 4})]):
        patched = model.trace(A)
    clean = model.trace(A)
    resid = patched["decoder.1.resid_pre"]
    np.testing.assert_array_equal(resid[2], trace_b["decoder.1.resid_pre"][4])
    np.testing.assert_array_equal(np.delete(resid, 2, 0), np.delete(clean["decoder.1.resid_pre"], 2, 0))
    # Causal: positions before 2 cannot see the patch; position 2 and after do.
    np.testing.assert_array_equal(patched.output[:2], clean.output[:2])
    assert np.abs(patched.output[2:] - clean.output[2:]).min(axis=-1).max() > 0


def test_a_branched_batch_runs_each_row_as_its_own_ablated_pass():
    """Row 0 stays clean; row 1 + h ablates head h of layer 1, branched at layer 1's input."""
    model = KINDS["llama"][0]()
    factors = torch.ones(1 + H, H)
    for h in range(H):
        factors[1 + h, h] = 0.0
    with intervene([branch("decoder.1.resid_pre", H), scale_heads("decoder.1.attn", factors)]):
        rows = _run("llama", model, A)
    assert rows.shape[0] == 1 + H
    torch.testing.assert_close(rows[0], _run("llama", model, A)[0], rtol=1e-12, atol=1e-12)
    for h in range(H):
        with intervene(ablate_heads([Head("decoder", 1, h)])):
            one = _run("llama", model, A)
        torch.testing.assert_close(rows[1 + h], one[0], rtol=1e-10, atol=1e-10)


def test_bad_edits_are_refused_clearly():
    model = KINDS["gpt2"][0]()
    short = patch("decoder.0.resid_pre", np.zeros((3, D)))
    with pytest.raises(ValueError, match="source has shape"), intervene([short]):
        model.trace(A)
    with pytest.raises(ValueError, match="out of range"), intervene(ablate_heads([Head("decoder", 0, H)])):
        model.trace(A)
    with pytest.raises(ValueError, match="stack"):
        Head("middle", 0, 0)
    with pytest.raises(ValueError, match="how"):
        ablate_heads([Head("decoder", 0, 0)], how="random")


def test_concurrent_calls_with_different_interventions_do_not_interfere():
    model = KINDS["gpt2"][0]()
    jobs = [[], [Head("decoder", 0, 0)], [Head("decoder", 1, 2)], [Head("decoder", 0, 1), Head("decoder", 1, 3)]]
    expected = []
    for heads in jobs:
        with intervene(ablate_heads(heads)):
            expected.append(_run("gpt2", model, A))
    barrier = threading.Barrier(len(jobs))

    def worker(i):
        out = []
        for _ in range(10):
            barrier.wait()
            with intervene(ablate_heads(jobs[i])):
                out.append(_run("gpt2", model, A))
        return out

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(worker, range(len(jobs))))
    for i, outs in enumerate(results):
        assert all(torch.equal(o, expected[i]) for o in outs)
    assert not torch.equal(expected[0], expected[1])


def test_the_checker_names_each_unknown_name_once_with_the_closest_names():
    """gpt2's names, 2 layers: "decoder.9.resid_pre" is one digit off "decoder.0.resid_pre" and "decoder.1.resid_pre"
    (ratio 36/38, both beginning "decoder."), then "decoder.0.resid_post" (32/39); "logits" is 12/17 like
    "head.logits" (at least 0.6) and like no other; "xyz" is like none."""
    model = KINDS["gpt2"][0]()
    names = ("decoder.9.resid_pre", "decoder.0.resid_pre", "logits", "xyz", "logits")
    with pytest.raises(HookNameError) as refused:
        check_names(model.hook_names, [Edit(name, lambda x, hook: x) for name in names])
    assert str(refused.value) == (
        'no hook point "decoder.9.resid_pre" in this model; closest: "decoder.0.resid_pre", "decoder.1.resid_pre", '
        '"decoder.0.resid_post"\n'
        'no hook point "logits" in this model; closest: "head.logits"\n'
        'no hook point "xyz" in this model; none is close (see model.hook_names)'
    )
    assert isinstance(refused.value, KeyError) and isinstance(refused.value, ValueError)
    assert refused.value.closest["logits"] == ("head.logits",) and refused.value.closest["xyz"] == ()
    check_names(model.hook_names, [Edit("decoder.0.resid_pre", lambda x, hook: x)])  # known: nothing raised
    with pytest.raises(HookNameError, match=r'^no hook point "decoder\.0\.attn\.weights" in this model; it has no '):
        check_names((), [Edit("decoder.0.attn.weights", lambda x, hook: x)])  # a model with no hook points


def test_the_closest_names_share_the_misspelled_names_stack_and_layer_first():
    """By difflib's ratio alone "decoder.3.atn.z" is nearer "decoder.13.attn.z" (two letters more: 30/32) than
    "decoder.3.attn.q" (28/31); the names of its own layer come first, then the others by ratio. Case is ignored."""
    names = ("decoder.3.attn.q", "decoder.3.attn.z", "decoder.13.attn.z", "decoder.23.attn.z", "head.logits")
    assert closest_names("decoder.3.atn.z", names) == ("decoder.3.attn.z", "decoder.3.attn.q", "decoder.13.attn.z")
    assert closest_names("Decoder.3.Attn.Z", names, n=1) == ("decoder.3.attn.z",)
    assert closest_names("embed", names) == ()
