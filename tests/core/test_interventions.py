"""Interventions through the hook points: ablating, scaling and patching, per call, on every model kind."""

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import D, H, _seeded, image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.capture import capture
from tformer_core.capture import intervene as unchecked_intervene
from tformer_core.interventions import (
    Edit,
    Head,
    Hook,
    HookNameError,
    ablate_heads,
    branch,
    check_names,
    closest_names,
    patch,
    scale_heads,
)
from tformer_core.models.detr import DETR, DETRConfig
from tformer_core.models.mae import MAE, MAEConfig
from tformer_core.models.pooling import PoolingClassifier, PoolingConfig
from tformer_core.models.rnn import RNNConfig, RNNSeq2Seq

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
    with model.intervene(ablate_heads([])):
        same = _run(kind, model, x)
    with model.intervene([scale_heads(Head(STACKS.get(kind, ("encoder",))[0], 0, 0).block, torch.ones(H))]):
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
        with model.intervene(ablate_heads([head])):
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
    with model.intervene(ablate_heads([Head(stack, 0, 1)], how="mean")):
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
    with model.intervene(ablate_heads([Head("decoder", 0, 3)], factor=2.0)):
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
    with model.intervene(edits):
        patched = _run(kind, model, a)
    torch.testing.assert_close(patched, _run(kind, model, b), rtol=1e-12, atol=1e-12)
    assert (_run(kind, model, a) - _run(kind, model, b)).abs().max() > 1e-6


def test_patching_positions_moves_one_token_of_the_residual_stream():
    model = KINDS["gpt2"][0]()
    trace_b = model.trace(B)
    with model.intervene([patch("decoder.1.resid_pre", trace_b, {2: 4})]):
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
    with model.intervene([branch("decoder.1.resid_pre", H), scale_heads("decoder.1.attn", factors)]):
        rows = _run("llama", model, A)
    assert rows.shape[0] == 1 + H
    torch.testing.assert_close(rows[0], _run("llama", model, A)[0], rtol=1e-12, atol=1e-12)
    for h in range(H):
        with model.intervene(ablate_heads([Head("decoder", 1, h)])):
            one = _run("llama", model, A)
        torch.testing.assert_close(rows[1 + h], one[0], rtol=1e-10, atol=1e-10)


def test_bad_edits_are_refused_clearly():
    model = KINDS["gpt2"][0]()
    short = patch("decoder.0.resid_pre", np.zeros((3, D)))
    with pytest.raises(
        ValueError, match=r"^decoder\.0\.resid_pre: the source has shape \(3, 16\), this pass \(6, 16\)$"
    ):
        model.trace(A, edits=[short])
    with pytest.raises(ValueError, match=r"^head 4 is out of range: decoder\.0\.attn\.z has 4 heads$"):
        model.trace(A, edits=ablate_heads([Head("decoder", 0, H)]))
    with pytest.raises(ValueError, match="stack"):
        Head("middle", 0, 0)
    with pytest.raises(ValueError, match="how"):
        ablate_heads([Head("decoder", 0, 0)], how="random")


def test_concurrent_calls_with_different_interventions_do_not_interfere():
    model = KINDS["gpt2"][0]()
    jobs = [[], [Head("decoder", 0, 0)], [Head("decoder", 1, 2)], [Head("decoder", 0, 1), Head("decoder", 1, 3)]]
    expected = []
    for heads in jobs:
        with model.intervene(ablate_heads(heads)):
            expected.append(_run("gpt2", model, A))
    barrier = threading.Barrier(len(jobs))

    def worker(i):
        out = []
        for _ in range(10):
            barrier.wait()
            with model.intervene(ablate_heads(jobs[i])):
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


# The kinds without a builder in tiny_models, as small: their trace takes edits as every kind's does.
def tiny_mae():
    config = MAEConfig(image_size=(16, 16), patch_size=4, n_layers=1, d_model=D, n_heads=H, d_ff=32, decoder_d_model=8)
    return _seeded(lambda: MAE(config))


def tiny_detr():
    backbone = dict(backbone_layer_type="basic", backbone_embedding_size=8, backbone_hidden_sizes=(8, 16))
    sizes = dict(d_model=D, n_heads=H, d_ff=32, n_encoder_layers=1, n_decoder_layers=2, n_queries=3, n_classes=2)
    return _seeded(lambda: DETR(DETRConfig(**sizes, **backbone, backbone_depths=(1, 1))))


def tiny_pooling():
    return _seeded(lambda: PoolingClassifier(PoolingConfig(vocab_size=20, d_embed=8, d_hidden=8, d_score=8)))


def tiny_rnn():
    return _seeded(lambda: RNNSeq2Seq(RNNConfig(src_vocab_size=20, tgt_vocab_size=20, d_embed=8, d_hidden=8, d_attn=8)))


# Every model kind (every `trace`, and a ViT's trace_batch): (tiny model, its trace of one input under `edits`, an
# activation the tests halve).
TRACED = {
    "encoder": (tiny_encoder, lambda m, edits: m.trace(A, edits=edits), "encoder.1.attn.z"),
    "decoder": (tiny_decoder, lambda m, edits: m.trace(A, edits=edits), "decoder.0.attn.z"),
    "encoder-decoder": (tiny_seq2seq, lambda m, edits: m.trace(A, TGT, edits=edits), "decoder.1.cross_attn.z"),
    "vit": (tiny_vit, lambda m, edits: m.trace(image(0), edits=edits), "encoder.0.attn.z"),
    "vit-batch": (
        tiny_vit,
        lambda m, edits: m.trace_batch(torch.stack([image(0), image(1)]), edits=edits)[1],
        "encoder.1.resid_pre",
    ),
    "mae": (tiny_mae, lambda m, edits: m.trace(image(0, (16, 16)), seed=3, edits=edits), "decoder.0.attn.z"),
    "detr": (tiny_detr, lambda m, edits: m.trace(image(0, (32, 40)), edits=edits), "decoder.1.cross_attn.z"),
    "pooling": (tiny_pooling, lambda m, edits: m.trace(A, edits=edits), "pool.context"),
    "rnn": (tiny_rnn, lambda m, edits: m.trace(A, [1, 5, 9], edits=edits), "encoder.states"),
}


def _same(a, b):
    assert a.names == b.names and a.tokens == b.tokens and a.target_tokens == b.target_tokens
    for name in a.names:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("kind", TRACED)
def test_trace_with_edits_equals_the_trace_inside_intervene_and_inside_the_unchecked_mechanism(kind):
    build, trace, name = TRACED[kind]
    model = build()
    halve = [Edit(name, lambda x, hook: x * 0.5)]
    given = trace(model, halve)
    with model.intervene(halve):
        inside = trace(model, ())
    with unchecked_intervene(halve):
        unchecked = trace(model, ())
    _same(given, inside)
    _same(given, unchecked)
    clean = trace(model, ())
    np.testing.assert_array_equal(given[name], clean[name] * 0.5)  # applied once, where it was named
    assert np.abs(given.output - clean.output).max() > 1e-6  # and what follows from it changed
    _same(trace(model, ()), clean)  # nothing left behind


@pytest.mark.parametrize("kind", TRACED)
def test_a_misspelled_name_is_refused_on_every_kind_before_its_pass(kind):
    build, trace, name = TRACED[kind]
    model = build()
    misspelled = name + name[-1]  # "attn.zz", "resid_pree", "contextt"
    ran = []
    with capture() as sink, pytest.raises(HookNameError) as refused:
        trace(model, [Edit(misspelled, lambda x, hook: ran.append(hook) or x)])
    assert refused.value.closest[misspelled][0] == name  # one letter more: the name meant is the closest
    assert sink.tensors == {} and ran == []


def test_a_misspelled_name_raises_with_the_closest_names_and_nothing_runs():
    """An encoder-decoder, so that the closest names could come from either stack, either attention, any layer.
    "decoder.2.atn.z" is one letter short of "decoder.2.attn.z" (difflib ratio 30/31); of the other names that begin
    as it does ("decoder.2."), q, k and v are two letters off (28/31), q and k first in the model's order."""
    model = tiny_seq2seq().double()
    ran, entered = [], []
    good = Edit("decoder.0.attn.z", lambda z, hook: ran.append(hook) or z)
    typo = Edit("decoder.2.atn.z", lambda z, hook: ran.append(hook) or z)
    expected = 'no hook point "decoder.2.atn.z" in this model; closest: "decoder.2.attn.z", "decoder.2.attn.q", '
    expected += '"decoder.2.attn.k"'
    with capture() as sink:
        with pytest.raises(HookNameError) as by_trace:
            model.trace(A, TGT, edits=[good, typo])
        with pytest.raises(HookNameError) as by_block, model.intervene([typo, good]):
            entered.append(model(torch.tensor([A]), torch.tensor([TGT])))
        with pytest.raises(HookNameError) as by_checker:
            check_names(model.hook_names, [good, typo])
    assert str(by_trace.value) == str(by_block.value) == str(by_checker.value) == expected
    assert sink.tensors == {} and ran == [] and entered == []  # no pass ran, no edit was called
    assert isinstance(by_trace.value, KeyError) and isinstance(by_trace.value, ValueError)
    assert by_trace.value.closest == {"decoder.2.atn.z": ("decoder.2.attn.z", "decoder.2.attn.q", "decoder.2.attn.k")}


def test_a_model_transformers_runs_has_no_hook_point_to_edit(tmp_path):
    from tests.core.hf_helpers import save_with_words, tiny_opt
    from tformer_core.checkpoints.fallback import load_transformers

    model = load_transformers(save_with_words(tiny_opt(), tmp_path / "opt", tokenizer=False))
    assert model.hook_names == ()
    with capture() as sink, pytest.raises(HookNameError) as refused:
        model.trace([2, 9, 6], edits=[Edit("decoder.0.attn.weights", lambda x, hook: x)])
    assert str(refused.value) == 'no hook point "decoder.0.attn.weights" in this model; it has no hook points at all'
    assert sink.tensors == {}
    assert model.trace([2, 9, 6], edits=[]).names == model.trace([2, 9, 6]).names  # no edits: an ordinary trace


# model, its pass, the names edited (in no particular order) -> (the hook each edit received, the shape it received),
# in the order the pass reaches them. Shapes: 6 source tokens, 5 target tokens, D = 16, H = 4 heads of 4; a ViT's
# 3 x 4 patches and 2 prefix tokens, 5 classes; the RNN's 3 target steps, 8 hidden units, 20 words.
SEEN = {
    "encoder": (
        tiny_encoder,
        lambda m, edits: m.trace(A, edits=edits),
        ["encoder.out", "encoder.1.attn.z", "encoder.embed.out", "encoder.0.resid_post"],
        [
            (Hook("encoder.embed.out", "encoder", None), (1, 6, 16)),
            (Hook("encoder.0.resid_post", "encoder", 0), (1, 6, 16)),
            (Hook("encoder.1.attn.z", "encoder", 1), (1, 4, 6, 4)),
            (Hook("encoder.out", "encoder", None), (1, 6, 16)),
        ],
    ),
    "decoder": (
        tiny_decoder,
        lambda m, edits: m.trace(A, edits=edits),
        ["head.logits", "decoder.1.mlp.out", "decoder.0.attn.weights", "decoder.out"],
        [
            (Hook("decoder.0.attn.weights", "decoder", 0), (1, 4, 6, 6)),
            (Hook("decoder.1.mlp.out", "decoder", 1), (1, 6, 16)),
            (Hook("decoder.out", "decoder", None), (1, 6, 16)),
            (Hook("head.logits", None, None), (1, 6, 40)),
        ],
    ),
    "cross-attention": (
        tiny_seq2seq,
        lambda m, edits: m.trace(A, TGT, edits=edits),
        ["head.logits", "decoder.2.cross_attn.z", "decoder.0.attn.z", "encoder.1.attn.weights", "decoder.embed.out"],
        [
            (Hook("encoder.1.attn.weights", "encoder", 1), (1, 4, 6, 6)),
            (Hook("decoder.embed.out", "decoder", None), (1, 5, 16)),
            (Hook("decoder.0.attn.z", "decoder", 0), (1, 4, 5, 4)),
            (Hook("decoder.2.cross_attn.z", "decoder", 2), (1, 4, 5, 4)),
            (Hook("head.logits", None, None), (1, 5, 35)),
        ],
    ),
    "vit": (
        tiny_vit,
        lambda m, edits: m.trace(image(0), edits=edits),
        ["head.logits", "encoder.1.resid_post", "encoder.0.attn.weights", "encoder.embed.patch"],
        [
            (Hook("encoder.embed.patch", "encoder", None), (1, 12, 16)),
            (Hook("encoder.0.attn.weights", "encoder", 0), (1, 4, 14, 14)),
            (Hook("encoder.1.resid_post", "encoder", 1), (1, 14, 16)),
            (Hook("head.logits", None, None), (1, 5)),
        ],
    ),
    "rnn": (
        tiny_rnn,
        lambda m, edits: m.trace(A, [1, 5, 9], edits=edits),
        ["head.logits", "attn.weights", "encoder.states"],
        [
            (Hook("encoder.states", "encoder", None), (1, 6, 8)),
            (Hook("attn.weights", None, None), (1, 3, 6)),
            (Hook("head.logits", None, None), (1, 3, 20)),
        ],
    ),
}


@pytest.mark.parametrize("kind", SEEN)
def test_an_edit_receives_its_hooks_name_stack_and_layer(kind):
    build, trace, names, expected = SEEN[kind]
    seen = []

    def record(x, hook):
        seen.append((hook, tuple(x.shape)))
        return x

    trace(build(), [Edit(name, record) for name in names])
    assert seen == expected


def test_an_edit_written_in_a_notebook_equals_the_cores_ablation():
    """`Edit(name, lambda z, hook: ...)`: zeroing a layer's z equals ablating each of its heads; an edit that reads
    hook.layer halves layer 1 only."""
    model = tiny_decoder().double()
    every_head = [Head("decoder", 1, h) for h in range(H)]
    by_hand = model.trace(A, edits=[Edit("decoder.1.attn.z", lambda z, hook: z * 0)])
    _same(by_hand, model.trace(A, edits=ablate_heads(every_head)))
    halve_layer_1 = [
        Edit(f"decoder.{layer}.attn.z", lambda z, hook: z * 0.5 if hook.layer == 1 else z) for layer in (0, 1)
    ]
    _same(model.trace(A, edits=halve_layer_1), model.trace(A, edits=ablate_heads(every_head, factor=0.5)))


def test_nested_blocks_compose_in_order_and_unwind():
    model = tiny_decoder().double()
    name = "decoder.1.resid_pre"
    x = model.trace(A)[name]
    double, add_one = Edit(name, lambda x, hook: x * 2), Edit(name, lambda x, hook: x + 1)
    with model.intervene([double]):
        with model.intervene([add_one]):
            inner = model.trace(A)[name]
            innermost = model.trace(A, edits=[double])[name]
        outer = model.trace(A)[name]
    after = model.trace(A)[name]
    np.testing.assert_array_equal(inner, x * 2 + 1)  # the enclosing block's edit first
    np.testing.assert_array_equal(innermost, (x * 2 + 1) * 2)  # a trace's own edits last
    np.testing.assert_array_equal(outer, x * 2)
    np.testing.assert_array_equal(after, x)
    with model.intervene([add_one, double]):  # in one list, in the order given
        np.testing.assert_array_equal(model.trace(A)[name], (x + 1) * 2)


def test_edits_do_not_leak_into_another_threads_pass():
    """One thread's edited pass is held open at its hook point while another thread traces the same model."""
    model = tiny_decoder().double()
    clean = model.trace(A)
    halved = model.trace(A, edits=[Edit("decoder.0.resid_pre", lambda x, hook: x * 0.5)])
    in_pass, other_done = threading.Event(), threading.Event()

    def hold(x, hook):
        in_pass.set()
        assert other_done.wait(30), "the other thread's pass did not finish"
        return x * 0.5

    def edited():
        with model.intervene([Edit("decoder.0.resid_pre", hold)]):
            return model.trace(A)

    def plain():
        assert in_pass.wait(30), "the edited pass did not start"
        try:
            return model.trace(A)
        finally:
            other_done.set()

    with ThreadPoolExecutor(2) as pool:
        edited_run, plain_run = pool.submit(edited), pool.submit(plain)
        edited_trace, plain_trace = edited_run.result(), plain_run.result()
    _same(plain_trace, clean)
    _same(edited_trace, halved)
    assert np.abs(halved.output - clean.output).max() > 1e-6
