"""Information flow: the parts of every update sum to it, each share is its definition, the graph's invariants."""

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.hf_helpers import DEIT
from tests.core.test_interventions import tiny_llama
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core import flow as flow_module
from tformer_core.flow import (
    Flow,
    UpdateShares,
    attention_parts,
    edges_into,
    ffn_parts,
    flow_graph,
    flow_rollout,
    information_flow,
    proximity_shares,
)

A = [3, 7, 1, 12, 9, 4, 22]

# kind -> (model builder, in float64, and its trace)
CASES = {
    "encoder-post": (lambda: tiny_encoder().double(), lambda m: m.trace(A)),
    "encoder-pre": (lambda: tiny_encoder(norm="pre").double(), lambda m: m.trace(A)),
    "gpt2": (lambda: tiny_decoder().double(), lambda m: m.trace(A)),
    "llama-gqa": (lambda: tiny_llama().double(), lambda m: m.trace(A)),
    "deit": (lambda: tiny_vit().double(), lambda m: m.trace(image().double())),
}


def all_parts(model, trace):
    for layer in range(trace.n_layers):
        yield attention_parts(model, trace, layer, "source", dtype=torch.float64)
        yield attention_parts(model, trace, layer, "head", dtype=torch.float64)
        yield ffn_parts(model, trace, layer, dtype=torch.float64)


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    build, run = CASES[request.param]
    model = build()
    return model, run(model)


def test_the_parts_of_every_update_sum_to_the_residual_stream_after_it(case):
    model, trace = case
    for parts in all_parts(model, trace):
        np.testing.assert_allclose(parts.total().numpy(), parts.whole.numpy(), rtol=0, atol=1e-12)


def test_a_sources_part_is_the_sum_of_its_heads_parts(case):
    model, trace = case
    for layer in range(trace.n_layers):
        by_head = attention_parts(model, trace, layer, "head", dtype=torch.float64).blocks
        by_source = attention_parts(model, trace, layer, "source", dtype=torch.float64).blocks
        np.testing.assert_allclose(by_head.sum(2).numpy(), by_source.numpy(), rtol=0, atol=1e-12)


def proximity(part: np.ndarray, whole: np.ndarray, p: int) -> float:
    return max(0.0, float(np.linalg.norm(whole, p) - np.linalg.norm(whole - part, p)))


@pytest.mark.parametrize("p", [1, 2])
def test_shares_against_their_definition_computed_from_the_trace_one_cell_at_a_time(case, p):
    """Each head's part w^h_ij v^h_j W_O^h rebuilt from trace.attention, trace.v (the key/value head the query head
    reads) and W_O in numpy; every part's proximity to the whole by the formula, normalised over the parts."""
    model, trace = case
    flow = information_flow(model, trace, p=p, dtype=torch.float64, keep_heads=True)
    w = model.weights()
    layer = trace.n_layers - 1
    n, H = len(trace.tokens), trace.n_heads
    for i in (0, n // 2, n - 1):
        head_parts = np.zeros((n, H, w.W_O.shape[-1]))
        for j in range(n):
            for h in range(H):
                weight = trace.attention(layer, h)[i, j]
                head_parts[j, h] = weight * trace.v(layer, h)[j] @ w.block(layer).attn.W_O[h].numpy()
        others = attention_parts(model, trace, layer, "head", dtype=torch.float64)
        residual, bias, beta, whole = (t[i].numpy() for t in (others.residual, others.bias, others.beta, others.whole))
        if flow.norm == "pre":
            np.testing.assert_allclose(residual, trace[f"{trace.main_stack}.{layer}.resid_pre"][i])
            np.testing.assert_allclose(bias, w.block(layer).attn.b_O.numpy())
        else:
            head_parts = post_norm(head_parts, model, trace, layer, i)
        by_head = np.array([[proximity(head_parts[j, h], whole, p) for h in range(H)] for j in range(n)])
        by_source = np.array([proximity(head_parts[j].sum(0), whole, p) for j in range(n)])
        rest = [proximity(x, whole, p) for x in (residual, bias, beta)]
        np.testing.assert_allclose(flow.heads.blocks[layer, i], by_head / (by_head.sum() + sum(rest)), atol=1e-12)
        np.testing.assert_array_equal(flow.top_head[layer, i], np.argmax(flow.heads.blocks[layer, i], -1))
        np.testing.assert_allclose(flow.top_head_share[layer, i], flow.heads.blocks[layer, i].max(-1), atol=1e-15)
        np.testing.assert_allclose(
            flow.attention.blocks[layer, i], by_source / (by_source.sum() + sum(rest)), atol=1e-12
        )
        ffn = trace[f"{trace.main_stack}.{layer}.mlp.out"][i]
        if flow.norm == "pre":
            after_attn = trace[f"{trace.main_stack}.{layer}.resid_after_attn"][i]
            ffn_whole = trace[f"{trace.main_stack}.{layer}.resid_post"][i]
            f, r = proximity(ffn, ffn_whole, p), proximity(after_attn, ffn_whole, p)
            np.testing.assert_allclose(
                [flow.ffn.blocks[layer, i, 0], flow.ffn.residual[layer, i]], [f / (f + r), r / (f + r)]
            )


def post_norm(head_parts, model, trace, layer, i):
    """A post-norm's parts by hand: LayerNorm's divisor of the real sum x + attn_out, each part centred, divided
    by it and scaled by gamma."""
    ln = model.weights().block(layer).ln_attn
    stack = trace.main_stack
    u = trace[f"{stack}.{layer}.resid_pre"][i] + trace[f"{stack}.{layer}.attn.out"][i]
    sigma = np.sqrt(u.var() + ln.eps)
    return (head_parts - head_parts.mean(-1, keepdims=True)) / sigma * ln.w.numpy()


def test_shares_of_each_update_sum_to_one_and_lie_between_0_and_1(case):
    model, trace = case
    flow = information_flow(model, trace, keep_heads=True)
    assert information_flow(model, trace).heads is None  # kept only when asked: L x T^2 x heads numbers
    for shares in (flow.attention, flow.heads, flow.ffn):
        np.testing.assert_allclose(shares.total(), 1.0, atol=1e-5)
        for part in (shares.blocks, shares.residual, shares.bias, shares.beta):
            assert part.min() >= 0 and part.max() <= 1
    decoder = trace.kind == "decoder"
    if decoder:  # a causal model's position i reads nothing after it: those parts are 0, so are their shares
        future = np.triu(np.ones((len(A), len(A)), dtype=bool), 1)
        assert (flow.attention.blocks[:, future] == 0).all() and (flow.heads.blocks[:, future] == 0).all()
    assert flow.norm == ("post" if "post" in str(model.config.norm) else "pre")
    if flow.norm == "pre":
        assert (flow.attention.beta == 0).all() and (flow.ffn.beta == 0).all()


def test_proximity_shares_worked_by_hand():
    # whole (3, 1) = a (2, 0) + b (1, 2) + c (0, -1). L1: ||w|| = 4; ||w - a|| = |1| + |1| = 2 -> 2;
    # ||w - b|| = |2| + |-1| = 3 -> 1; ||w - c|| = |3| + |2| = 5 -> max(0, -1) = 0. Shares 2/3, 1/3, 0.
    whole = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    parts = torch.tensor([[[2.0, 0.0], [1.0, 2.0], [0.0, -1.0]]], dtype=torch.float64)
    np.testing.assert_allclose(proximity_shares(parts, whole, p=1).numpy(), [[2 / 3, 1 / 3, 0.0]], rtol=1e-15)
    # L2: ||w|| = sqrt 10; ||w - a|| = sqrt 2; ||w - b|| = sqrt 5; ||w - c|| = sqrt 13 > sqrt 10 -> 0.
    a, b = np.sqrt(10) - np.sqrt(2), np.sqrt(10) - np.sqrt(5)
    np.testing.assert_allclose(proximity_shares(parts, whole, p=2).numpy(), [[a / (a + b), b / (a + b), 0.0]])
    # A whole of zero: every proximity is 0, so is every share (no division by zero).
    zero = proximity_shares(torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]]), torch.zeros(1, 2))
    np.testing.assert_array_equal(zero.numpy(), [[0.0, 0.0]])


def reachable_by_hand(flow, threshold):
    """Every edge with share > threshold, then a breadth-first walk backwards from the prediction's node, one edge at
    a time: the set of (kind, stage, layer, source, target) the graph must keep."""
    n, L = len(flow.tokens), flow.n_layers
    candidates = []
    for layer in range(L):
        for i in range(n):
            for j in range(n):
                candidates.append(("attention", "attn", layer, j, i, flow.attention.blocks[layer, i, j]))
            candidates.append(("residual", "attn", layer, i, i, flow.attention.residual[layer, i]))
            candidates.append(("ffn", "ffn", layer, i, i, flow.ffn.blocks[layer, i, 0]))
            candidates.append(("residual", "ffn", layer, i, i, flow.ffn.residual[layer, i]))
    level = {"attn": 0, "ffn": 1}
    alive, kept, frontier = {(2 * L, flow.prediction)}, set(), [(2 * L, flow.prediction)]
    while frontier:
        node = frontier.pop()
        for kind, stage, layer, j, i, share in candidates:
            src = (2 * layer + level[stage], j)
            if share > threshold and (src[0] + 1, i) == node:
                kept.add((kind, stage, layer, j, i))
                if src not in alive:
                    alive.add(src)
                    frontier.append(src)
    return kept, alive


@pytest.mark.parametrize("case_name", ["encoder-post", "llama-gqa"])
def test_the_pruned_graph_keeps_exactly_the_edges_above_the_threshold_that_reach_the_prediction(case_name):
    build, run = CASES[case_name]
    model = build()
    flow = information_flow(model, run(model), keep_heads=True)
    for threshold in (0.0, 0.02, 0.1, 0.3):
        graph = flow_graph(flow, threshold)
        kept = {(e.kind, e.stage, e.layer, e.source, e.target) for e in graph.edges}
        expected, alive = reachable_by_hand(flow, threshold)
        assert kept == expected and set(graph.nodes) == alive
        assert all(e.share > threshold for e in graph.edges)
        for e in graph.edges:
            assert (e.head is not None) == (e.kind == "attention")
            if e.head is not None:
                shares = flow.heads.blocks[e.layer, e.target, e.source]
                assert e.head == int(np.argmax(shares)) and e.head_share == pytest.approx(shares.max())
    zero = flow_graph(flow, 0.0)
    assert any(e.layer == 0 for e in zero.edges)  # the input tokens reached
    assert flow_graph(flow, 1.0).edges == ()
    assert flow_graph(flow, 1.0).nodes == {(2 * flow.n_layers, flow.prediction)}
    lower = {(e.kind, e.stage, e.layer, e.source, e.target) for e in flow_graph(flow, 0.05).edges}
    assert {(e.kind, e.stage, e.layer, e.source, e.target) for e in flow_graph(flow, 0.1).edges} <= lower


def test_the_prediction_defaults_to_the_next_token_and_the_class_token():
    decoder = tiny_decoder().double()
    assert information_flow(decoder, decoder.trace(A)).prediction == len(A) - 1
    vit = tiny_vit().double()
    assert information_flow(vit, vit.trace(image().double())).prediction == 0
    graph = flow_graph(information_flow(decoder, decoder.trace(A), position=2), 0.0)
    assert graph.prediction == 2 and all(e.target <= 2 for e in graph.edges)  # causal: nothing after 2 reaches it


def test_without_the_per_head_split_the_shares_are_the_same_and_no_edge_has_a_head():
    build, run = CASES["deit"]
    model = build()
    trace = run(model)
    whole, lean_flow = information_flow(model, trace), information_flow(model, trace, top_heads=False)
    for kind in ("attention", "ffn"):
        for field in ("blocks", "residual", "bias", "beta"):
            np.testing.assert_array_equal(
                getattr(getattr(lean_flow, kind), field), getattr(getattr(whole, kind), field)
            )
    assert (lean_flow.top_head == -1).all() and (lean_flow.top_head_share == 0).all()
    assert (whole.top_head >= 0).all()
    edges, with_heads = flow_graph(lean_flow, 0.02).edges, flow_graph(whole, 0.02).edges
    assert [(e.kind, e.layer, e.source, e.target) for e in edges] == [
        (e.kind, e.layer, e.source, e.target) for e in with_heads
    ]
    assert any(e.kind == "attention" for e in edges) and all(e.head is None for e in edges)
    with pytest.raises(ValueError, match="keep_heads needs the whole per-head split"):
        information_flow(model, trace, keep_heads=True, top_heads=False)
    # Only the class token's row split: its edges have the whole split's heads and shares, the other rows none.
    row = information_flow(model, trace, top_heads=[0])
    np.testing.assert_array_equal(row.top_head[:, 0], whole.top_head[:, 0])
    np.testing.assert_allclose(row.top_head_share[:, 0], whole.top_head_share[:, 0], rtol=1e-12)
    assert (row.top_head[:, 1:] == -1).all() and (row.top_head_share[:, 1:] == 0).all()
    np.testing.assert_array_equal(row.attention.blocks, whole.attention.blocks)
    with pytest.raises(ValueError, match="outside the input"):
        information_flow(model, trace, top_heads=[len(trace.tokens)])


def test_edges_into_a_position_are_every_layers_every_source_unpruned():
    build, run = CASES["llama-gqa"]
    model = build()
    flow = information_flow(model, run(model))
    edges = edges_into(flow)
    n, L = len(flow.tokens), flow.n_layers
    assert [(e.layer, e.source) for e in edges] == [(lay, j) for lay in range(L) for j in range(n)]
    assert all(e.kind == "attention" and e.target == flow.prediction == n - 1 for e in edges)
    assert [e.share for e in edges] == flow.attention.blocks[:, n - 1, :].ravel().tolist()
    assert [e.head for e in edges] == flow.top_head[:, n - 1, :].ravel().tolist()
    into_two = edges_into(flow, 2)
    assert {e.target for e in into_two} == {2} and all(e.share == 0 for e in into_two if e.source > 2)  # causal
    assert all(e.head is None for e in edges_into(information_flow(model, run(model), top_heads=False)))


def test_the_rollout_worked_by_hand():
    # One layer, two positions, the prediction at 1. The FFN at 1: its part 0.5, the residual 0.4 (beta 0.1, lost),
    # so the stream after attention at 1 holds 0.9. Attention at 1: source 0 0.2, source 1 0.5, the residual 0.2
    # (bias 0.1, lost): the input at 0 holds 0.9 * 0.2 = 0.18, at 1 0.9 * (0.5 + 0.2) = 0.63.
    shares = UpdateShares(
        blocks=np.array([[[0.7, 0.0], [0.2, 0.5]]]),
        residual=np.array([[0.2, 0.2]]),
        bias=np.array([[0.1, 0.1]]),
        beta=np.zeros((1, 2)),
    )
    ffn = UpdateShares(
        blocks=np.array([[[0.3], [0.5]]]),
        residual=np.array([[0.6, 0.4]]),
        bias=np.zeros((1, 2)),
        beta=np.full((1, 2), 0.1),
    )
    flow = Flow(("a", "b"), "blocks", "pre", 1, 1, shares, ffn, np.zeros((1, 2, 2), int), np.zeros((1, 2, 2)))
    np.testing.assert_allclose(flow_rollout(flow), [[0.18, 0.63], [0.0, 0.9], [0.0, 1.0]], rtol=1e-15)
    # From position 0: the FFN keeps 0.3 + 0.6 = 0.9 of it; attention at 0 reads 0.7 from 0 and its residual 0.2.
    np.testing.assert_allclose(flow_rollout(flow, 0), [[0.9 * 0.9, 0.0], [0.9, 0.0], [1.0, 0.0]], rtol=1e-15)
    with pytest.raises(ValueError, match="outside the input"):
        flow_rollout(flow, 2)


def rollout_by_paths(flow, level, position, target):
    """What node (level, position) holds: every path from it to the prediction's node, one edge at a time, the product
    of the shares along it, summed (exponential, for a tiny model only)."""
    if level == 2 * flow.n_layers:
        return float(position == target)
    layer, after_attention = divmod(level, 2)
    if after_attention:  # the FFN's edge and the residual's, both to (level + 1, position)
        edges = [(position, flow.ffn.blocks[layer, position, 0]), (position, flow.ffn.residual[layer, position])]
    else:  # attention edges position -> i, and the residual edge position -> position
        edges = [(i, flow.attention.blocks[layer, i, position]) for i in range(len(flow.tokens))]
        edges.append((position, flow.attention.residual[layer, position]))
    return sum(share * rollout_by_paths(flow, level + 1, i, target) for i, share in edges)


@pytest.mark.parametrize("case_name", ["deit", "llama-gqa", "encoder-post"])
def test_the_rollout_is_the_sum_over_every_path_of_the_products_of_its_shares(case_name):
    build, run = CASES[case_name]
    model = build()
    flow = information_flow(model, run(model), dtype=torch.float64)
    held = flow_rollout(flow)
    n, L = len(flow.tokens), flow.n_layers
    assert held.shape == (2 * L + 1, n)
    for level in range(2 * L + 1):
        by_paths = [rollout_by_paths(flow, level, j, flow.prediction) for j in range(n)]
        np.testing.assert_allclose(held[level], by_paths, rtol=1e-12, atol=1e-15)
    totals = held.sum(1)
    assert totals[-1] == 1.0 and np.all(totals[:-1] <= 1.0 + 1e-12) and np.all(np.diff(totals) >= -1e-12)
    if flow.norm == "post":  # beta's share is lost at every update: the input holds strictly less than the output
        assert totals[0] < 1.0


def test_long_inputs_split_into_chunks_give_the_same_shares(monkeypatch):
    model = tiny_llama().double()
    trace = model.trace(A)
    whole = information_flow(model, trace, dtype=torch.float64, keep_heads=True)
    monkeypatch.setattr(flow_module, "CHUNK_ELEMENTS", 2 * len(A) * trace.n_heads * 16)  # two query rows a chunk
    chunked = information_flow(model, trace, dtype=torch.float64, keep_heads=True)
    np.testing.assert_allclose(chunked.heads.blocks, whole.heads.blocks, atol=1e-14)
    np.testing.assert_array_equal(chunked.top_head, whole.top_head)


def test_bad_requests_say_why():
    seq2seq = tiny_seq2seq()
    with pytest.raises(ValueError, match="encoders, decoder-only models and ViTs"):
        information_flow(seq2seq, seq2seq.trace(A, [1, 2, 3]))
    model = tiny_decoder()
    trace = model.trace(A)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        information_flow(model, trace, p=3)
    with pytest.raises(ValueError, match="outside the input"):
        information_flow(model, trace, position=len(A))
    with pytest.raises(ValueError, match="between 0 and 1"):
        flow_graph(information_flow(model, trace), 1.5)
    kept = model.trace(A, keep=lambda name: "resid_after_attn" not in name)
    with pytest.raises(ValueError, match="resid_after_attn"):
        information_flow(model, kept)


# ---- the real models: parts add up in float64 -----------------------------------------------------------------


def assert_parts_add_up(model, trace):
    for parts in all_parts(model, trace):
        scale = float(parts.whole.abs().max())
        np.testing.assert_allclose(parts.total().numpy(), parts.whole.numpy(), rtol=0, atol=1e-11 * scale)


@pytest.mark.slow
def test_minilm_post_norm_parts_add_up():
    model = tc.load_model("minilm", device="cpu").double()
    trace = model.trace("The animal didn't cross the street because it was too tired.")
    assert_parts_add_up(model, trace)
    flow = information_flow(model, trace)
    assert flow.norm == "post" and flow.prediction == 0 and (flow.attention.beta > 0).any()


@pytest.mark.slow
def test_smollm2_grouped_query_parts_add_up(smollm2_folder):
    model = tc.load_model("smollm2", device="cpu").double()
    trace = model.trace("The capital of France is Paris. The capital of Germany is")
    assert_parts_add_up(model, trace)
    graph = flow_graph(information_flow(model, trace), 0.04)
    assert graph.prediction == len(trace.tokens) - 1 and graph.edges


def test_the_bundled_vit_class_token_parts_add_up():
    model = tc.load_model("vit-tiny", device="cpu").double()
    trace = model.trace(torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)).double())
    assert_parts_add_up(model, trace)
    assert flow_graph(information_flow(model, trace), 0.0).prediction == 0


@pytest.mark.slow
@pytest.mark.skipif(not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)")
def test_deit_tiny_parts_add_up():
    model = tc.load_model(str(DEIT), device="cpu", model_dirs=[DEIT.parent]).double()
    trace = model.trace(torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(0)).double())
    assert_parts_add_up(model, trace)
