"""A trace keeps the model's tensors where the model ran, in its dtype, and copies to numpy only what a view reads,
when it reads it: tracing converts nothing; a view that reads several tensors gets them in one transfer
(`tformer_core.trace.to_host`, counted here by patching it wherever it was imported)."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

import tformer_core as tc
import tformer_core.trace as trace_module
from tests.core.test_mae_detr import save_tiny_detr, save_tiny_mae
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.capture import matching
from tformer_core.checkpoints import load_folder
from tformer_core.generation import next_token_table
from tformer_core.models.llama import Llama, LlamaConfig
from tformer_core.models.pooling import PoolingClassifier, PoolingConfig
from tformer_core.models.rnn import RNNConfig, RNNSeq2Seq
from tformer_core.trace import _one_transfer
from tformer_views import detection as dv
from tformer_views import distance, overview, search, text, vision, why
from tformer_views import early_attention as ea
from tformer_views import mae as mae_view


class Conversions:
    """Calls of the one conversion to numpy (to_host) and of Tensor.numpy anywhere."""

    def __init__(self) -> None:
        self.transfers = 0
        self.numpy = 0

    def reset(self) -> Conversions:
        self.transfers = self.numpy = 0
        return self


@pytest.fixture
def conversions(monkeypatch) -> Conversions:
    counted = Conversions()
    real_to_host, real_numpy = trace_module.to_host, torch.Tensor.numpy

    def to_host(tensors):
        counted.transfers += 1
        return real_to_host(tensors)

    def numpy(self, *args, **kwargs):
        counted.numpy += 1
        return real_numpy(self, *args, **kwargs)

    for module in list(sys.modules.values()):  # every module that imported it by name, views included
        if getattr(module, "to_host", None) is real_to_host:
            monkeypatch.setattr(module, "to_host", to_host)
    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    return counted


def _gqa_llama() -> Llama:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, max_positions=32, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48)
    return Llama(config)


TRACED = {
    "encoder": lambda keep: tiny_encoder().trace([1, 2, 3, 4, 5], attention_mask=[1, 1, 1, 1, 0], keep=keep),
    "decoder": lambda keep: tiny_decoder().trace([1, 2, 3, 4], keep=keep),
    "llama": lambda keep: _gqa_llama().trace([3, 1, 4, 1, 5, 9], keep=keep),
    "seq2seq": lambda keep: tiny_seq2seq().trace([1, 2, 3], [1, 4, 5], keep=keep),
    "vit": lambda keep: tiny_vit().trace(image(), keep=keep),
    "vit-batch": lambda keep: tiny_vit().trace_batch(torch.stack([image(0), image(1)]), keep=keep)[1],
    "generation": lambda keep: tiny_decoder().generate([1, 2, 3], max_new_tokens=3, keep=keep).steps[-1],
}


@pytest.mark.parametrize("kind", list(TRACED))
def test_tracing_converts_nothing_to_numpy_until_a_view_reads(conversions, kind):
    for keep in (None, lambda name: True, trace_module.lean):
        conversions.reset()
        trace = TRACED[kind](keep)
        compact = trace.compact()  # what a cache stores: made on the device too
        assert (conversions.transfers, conversions.numpy) == (0, 0), f"{kind} with keep={keep}"
        assert all(isinstance(t, torch.Tensor) for t in compact.activations.values())
    stack = trace.attention_stacks[-1]
    weights = trace.attention(0, 1, stack)  # a view reads one head: one transfer, of that head only
    assert conversions.transfers == 1 and weights.ndim == 2 and not weights.flags.writeable


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """Views take the path they take on a GPU (reduce with torch where the tensors are, copy the result once),
    here on the CPU's tensors; by default the CPU's views reduce with numpy over zero-copy arrays."""
    monkeypatch.setattr(trace_module, "HOST_DEVICE_TYPES", ())
    assert trace_module.reduces_on_device(torch.device("cpu"))


def test_views_that_read_several_tensors_copy_them_in_one_transfer(conversions, as_on_a_gpu):
    model = tiny_encoder()
    model.tokenizer = None
    trace = model.trace([1, 2, 3, 4, 5, 6], attention_mask=[1, 1, 1, 1, 1, 0])  # masked: weights and mask
    decoder_trace = tiny_decoder().trace([1, 2, 3, 4, 5])
    vit = tiny_vit()
    vit_trace = vit.trace(image())
    views = {
        "fetch": lambda: trace.fetch("encoder.0.attn.q", "encoder.0.attn.k", "encoder.1.attn.weights"),
        "head matrix": lambda: text.head_matrix(trace, 1, 2),
        "overview": lambda: overview.overview_thumbnails(trace),
        "token distances": lambda: distance.token_distances(decoder_trace),
        "peak weights": lambda: text.peak_weights(trace),
        "query rows": lambda: search.query_rows(trace, 2),
        "why this weight": lambda: why.why_this_weight(trace, 1, 3, 2),
        "predictions": lambda: decoder_trace.predictions(3),
        "next-token table": lambda: next_token_table(decoder_trace, 3),
        "compact next-token table": lambda: next_token_table(decoder_trace.compact(top_k=5), 3),
        "pixel distances": lambda: distance.image_distances(vit_trace),
        "attention map": lambda: vision.attention_map(vit_trace, 1, None, 3),
        "rollout": lambda: vision.rollout(vit_trace),
        "all attention": lambda: vit_trace.all_attention(),
    }
    for name, view in views.items():
        conversions.reset()
        view()
        assert conversions.transfers == 1, f"{name}: {conversions.transfers} transfers"


def test_distances_over_many_pictures_copy_one_grid_per_batch(conversions, as_on_a_gpu):
    vit = tiny_vit()
    vit.preprocessing = tc.ImagePreprocessing(resize=("exact", (12, 16)), mean=(0.5,) * 3, std=(0.25,) * 3)
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)) for _ in range(7)]
    conversions.reset()
    figures = distance.distances_over_images(vit, pictures, batch_size=3)
    assert conversions.transfers == 3 and figures.shape == (7, 2, 4)  # batches of 3, 3 and 1
    # The reduction on the device is the numpy one of each picture's own trace.
    one = vit.trace(vit.preprocessing(pictures[4]))
    expected = tc.mean_attention_distance(
        one.all_attention(), one.patch_grid, one.patch_side, one.n_prefix_tokens, False
    )
    np.testing.assert_allclose(figures[4], expected, rtol=1e-5)


def test_one_transfer_packs_tensors_of_every_dtype_into_one_copy(monkeypatch):
    tensors = [
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
        torch.tensor([[True, False, True]]),
        torch.tensor([1.5, -2.25], dtype=torch.bfloat16),  # widened to float32 on the way
        torch.arange(5, dtype=torch.int64),
        torch.tensor(3.0, dtype=torch.float64),  # 0-d
        torch.zeros(0, 7, dtype=torch.int32),  # empty
        torch.tensor([7], dtype=torch.int32),
    ]
    copies, real_cpu = [], torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copies.append(self.shape) or real_cpu(self, *a, **k))
    arrays = _one_transfer(tensors)
    assert len(copies) == 1  # one buffer crossed to the host, not seven
    for t, a in zip(tensors, arrays):
        wide = t.float() if t.dtype == torch.bfloat16 else t
        assert a.shape == tuple(t.shape) and a.dtype == wide.numpy().dtype and not a.flags.writeable
        np.testing.assert_array_equal(a, wide.numpy())
        assert a.ctypes.data % 8 == 0  # every array starts aligned


def test_a_bfloat16_trace_keeps_bfloat16_on_its_device_and_reads_as_float32():
    f32, bf16 = tiny_decoder(), tiny_decoder().place("cpu", torch.bfloat16)
    a, b = f32.trace([1, 2, 3, 4, 5]), bf16.trace([1, 2, 3, 4, 5])
    assert b.device == bf16.device and b.tensor("decoder.1.attn.q").dtype == torch.bfloat16
    assert b.block_tensor("weights", 1).dtype == torch.bfloat16  # recomputed from Q and K in the model's dtype
    assert b["decoder.1.attn.q"].dtype == np.float32 and b.attention(1).dtype == np.float32
    # Half the bytes: everything but the float32 logits and the boolean mask is stored in bfloat16.
    exempt = trace_module.tensor_bytes(t for n, t in a.activations.items() if n == "head.logits" or n.endswith(".mask"))
    assert b.nbytes - exempt == (a.nbytes - exempt) / 2
    np.testing.assert_allclose(b.attention(1), a.attention(1), atol=0.02)


def test_a_notebook_gets_torch_tensors_on_the_device_for_stored_and_derived_parts():
    trace = tiny_encoder().trace([1, 2, 3, 4])
    q = trace.tensor("encoder.0.attn.q")
    assert q is trace.activations["encoder.0.attn.q"] and q.device == trace.device
    scores = trace.tensor("encoder.0.attn.scores", head=2)  # derived from Q and K, for one head
    np.testing.assert_allclose(scores.numpy(), trace.q(0, 2) @ trace.k(0, 2).T, rtol=1e-6)
    with pytest.raises(KeyError, match=r"'encoder\.0\.attn\.nothing' was not captured"):
        trace.tensor("encoder.0.attn.nothing")


def test_a_trace_built_by_hand_from_numpy_shares_the_arrays():
    w = np.full((2, 3, 3), 1 / 3, dtype=np.float32)
    trace = tc.Trace("encoder", {"encoder.0.attn.weights": w}, ("a", "b", "c"), 2, {"encoder": 1})
    assert isinstance(trace.activations["encoder.0.attn.weights"], torch.Tensor)
    assert trace.nbytes == w.nbytes and trace.device.type == "cpu"
    assert np.shares_memory(trace.attention(0), w)


def _reductions(trace: tc.Trace, vit_trace: tc.Trace) -> dict:
    """Every view that reduces many layers or heads, on a text trace (special tokens hidden or not) and a picture's."""
    hidden_thumbs, hidden_shares, _ = overview.overview_thumbnails(trace, hide_special=True, size=3)  # 2 x 2 blocks
    return {
        "thumbnails": overview.overview_thumbnails(trace, size=4)[0],  # 6 tokens: blocks of 2, 3 x 3 thumbnails
        "thumbnails, special tokens hidden": hidden_thumbs,
        "shares on the hidden tokens": hidden_shares,
        "token distances": distance.token_distances(trace),
        "token distances, special tokens hidden": distance.token_distances(trace, hide_special=True),
        "peaks": text.peak_weights(trace),
        "query rows": search.query_rows(trace, 3),
        "all attention": trace.all_attention(),
        "pixel distances": distance.image_distances(vit_trace, renormalize=True),
        "rollout": vision.rollout(vit_trace, "max", 0.5),
    }


def test_the_gpu_path_of_every_reduction_gives_the_cpus_numbers(monkeypatch):
    """What a GPU computes with torch is what the CPU computes with numpy (float32 sums against float64)."""
    trace = tiny_decoder().trace([1, 2, 3, 4, 5, 6])  # causal: masked blocks in the thumbnails
    trace = replace(trace, tokens=("<s>", "a", "b", "</s>", "c", "d"))  # two special tokens to hide
    vit_trace = tiny_vit().trace(image())
    on_cpu = _reductions(trace, vit_trace)
    monkeypatch.setattr(trace_module, "HOST_DEVICE_TYPES", ())
    on_gpu = _reductions(trace, vit_trace)
    for name, expected in on_cpu.items():
        assert on_gpu[name].shape == expected.shape, name  # NaN where every cell is masked, on both alike
        np.testing.assert_allclose(on_gpu[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    assert on_cpu["thumbnails"].shape[-2:] == (3, 3) and np.isnan(on_cpu["thumbnails"]).any()  # causal: empty blocks


@pytest.fixture(scope="module")
def new_families(tmp_path_factory):
    """Issue 26's families, tiny: MAE and DETR loaded from transformers' checkpoints, the models before
    Transformers built from their configs."""
    mae_folder, detr_folder = tmp_path_factory.mktemp("mae"), tmp_path_factory.mktemp("detr")
    save_tiny_mae(mae_folder), save_tiny_detr(detr_folder)
    torch.manual_seed(0)
    pooling = PoolingClassifier(PoolingConfig(vocab_size=20, d_embed=4, d_hidden=4, d_score=4, pooling="attention"))
    mean = PoolingClassifier(PoolingConfig(vocab_size=20, d_embed=4, d_hidden=4, d_score=4, pooling="mean"))
    rnn = RNNSeq2Seq(RNNConfig(src_vocab_size=10, tgt_vocab_size=12, d_embed=8, d_hidden=8, d_attn=4))
    return load_folder(mae_folder), load_folder(detr_folder), pooling, mean, rnn


def test_the_new_families_trace_on_the_device_and_their_views_read_in_one_transfer(conversions, new_families):
    mae, detr, pooling, mean, rnn = new_families
    picture, keep_all = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(1)), lambda name: True
    conversions.reset()
    traces = {
        "pooling": [pooling.trace([3, 4, 5, 6], keep=k) for k in (None, keep_all)],
        "mean": [mean.trace([3, 4, 5, 6], keep=k) for k in (None, keep_all)],
        "rnn": [rnn.trace([4, 5, 6], [1, 7, 8, 9], keep=k) for k in (None, keep_all)],  # a given target
        "detr": [detr.trace(torch.randn(3, 96, 128), keep=k) for k in (None, keep_all, dv.KEEP)],
    }
    compacts = [t.compact() for ts in traces.values() for t in ts]
    assert (conversions.transfers, conversions.numpy) == (0, 0)
    assert all(isinstance(a, torch.Tensor) for t in compacts for a in t.activations.values())
    # An MAE names its encoder's tokens after the patches it kept, which the model chose where it ran: that one
    # [kept] row of ids is the only thing tracing copies.
    mae_trace = mae.trace(picture, seed=3, keep=matching("head.pixels", "encoder.1.attn.q", "encoder.1.attn.k"))
    assert conversions.transfers == 1 and len(mae_trace.tokens) == 1 + 4  # (a zero-copy .numpy() on the CPU)
    detr_result = dv.DetrResult(Image.new("RGB", (128, 96)), traces["detr"][2].compact())
    mae_result = mae_view.MAEResult(
        Image.new("RGB", (16, 16)), picture.numpy(), mae_trace, (0.5,) * 3, (0.25,) * 3, True
    )
    views = {
        "detections": lambda: dv.detections(detr_result, 0.0),
        "cross-attention map": lambda: dv.cross_map(detr_result, 2, 1, None),
        "queries' attention": lambda: dv.query_attention(detr_result, 1, 0, [0, 2, 4]),
        "masked patches' errors": lambda: mae_view.patch_errors(mae_result),
        "reconstruction": lambda: mae_view.reconstruction(mae_result),
        "alignment": lambda: ea.rnn_alignment(traces["rnn"][0]),
    }
    for name, view in views.items():
        conversions.reset()
        view()
        assert conversions.transfers == 1, f"{name}: {conversions.transfers} transfers"
    assert len(dv.detections(detr_result, 0.0)) == 5  # every query, with its box
