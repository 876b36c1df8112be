"""bfloat16 and float16 models computed as transformers computes them: RMSNorm in float32 rounded before gamma,
the softmax in float32, rotary tables in float32, logits widened to float32. Parity with transformers' eager
forward in the same dtype on tiny random checkpoints (no network), on the CPU: logits and every layer's
attention within the dtype's rounding. Capture does not change the output in half precision either."""

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import perturbed
from tests.core.test_checkpoints import _bert_like, _gpt2, _vit
from tests.core.test_llama import _hf as _llama_family

IDS = [int(i) for i in np.random.default_rng(0).integers(1, 99, 60)]  # 60 tokens: every tiny config reads 64
IMAGE = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))
CLASSES = {
    "llama": T.LlamaForCausalLM,
    "qwen3": T.Qwen3ForCausalLM,
    "bert": T.BertForMaskedLM,
    "gpt2": T.GPT2LMHeadModel,
    "vit": T.ViTForImageClassification,
}


def _build(family: str):
    if family in ("llama", "qwen3"):  # grouped-query attention; Llama 3.1's rotary scaling, Qwen3's q/k norms + YaRN
        return _llama_family(family)
    return {"bert": lambda: _bert_like("bert"), "gpt2": _gpt2, "vit": lambda: _vit("vit")}[family]()


# How far the weights are perturbed from their init: far enough for sharp attention, where a last bit apart in the
# scores shows in the weights. GPT-2 less: its Conv1D weights are [in, out], ours nn.Linear's [out, in], the same
# products summed by differently shaped matrix kernels (a last-bit difference that no rule removes) which sharp
# attention over 60 tokens amplifies to the bound; the other families agree with transformers to the bit.
SHARPNESS = {"gpt2": 0.1}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A saved tiny checkpoint per family."""
    made = {}
    for i, family in enumerate(CLASSES):
        torch.manual_seed(10 + i)
        folder = tmp_path_factory.mktemp(family)
        perturbed(_build(family), seed=i, scale=SHARPNESS.get(family, 0.3)).save_pretrained(folder / "checkpoint")
        made[family] = folder
    return made


def _pair(folders, family: str, dtype: torch.dtype):
    """(transformers' model loaded in `dtype`, the core's model loaded in `dtype`) from one folder."""
    folder = folders[family]
    theirs = CLASSES[family].from_pretrained(folder / "checkpoint", dtype=dtype, attn_implementation="eager").eval()
    ours = tc.load_model(str(folder / "checkpoint"), device="cpu", dtype=dtype, model_dirs=[folder])
    return theirs, ours


def _run(family: str, theirs, ours):
    """(our trace, transformers' output with attentions) on the same input."""
    if family == "vit":
        image = IMAGE.to(ours.dtype)
        with torch.no_grad():
            return ours.trace(image), theirs(pixel_values=image[None], output_attentions=True)
    with torch.no_grad():
        return ours.trace(IDS), theirs(torch.tensor([IDS]), output_attentions=True)


def rounding_bound(reference: np.ndarray, dtype: torch.dtype) -> float:
    """4 roundings of `dtype` at the reference's largest magnitude (bfloat16: 8 bits); benchmarks/half_precision.py
    holds the full-size models on a GPU to the same bound."""
    return 4 * torch.finfo(dtype).eps * max(1.0, float(np.abs(reference).max()))


def within_rounding(ours: np.ndarray, theirs: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """|ours - theirs| within rounding_bound."""
    reference = theirs.detach().float().numpy()
    bound = rounding_bound(reference, dtype)
    diff = float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - reference)))
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g} ({dtype})"


@pytest.mark.parametrize(
    "family, dtype",
    [
        ("llama", torch.bfloat16),
        ("qwen3", torch.bfloat16),
        ("bert", torch.bfloat16),
        ("gpt2", torch.bfloat16),
        ("vit", torch.bfloat16),
        ("llama", torch.float16),
    ],
)
def test_logits_and_attention_match_transformers_in_half_precision(folders, family, dtype):
    theirs, ours = _pair(folders, family, dtype)
    assert ours.dtype == dtype
    trace, out = _run(family, theirs, ours)
    assert trace.tensor("head.logits").dtype == torch.float32  # widened, as transformers' generate widens them
    within_rounding(trace["head.logits"], out.logits[0], dtype, "logits")
    for layer, weights in enumerate(out.attentions):
        assert weights.dtype == dtype and trace.block_tensor("weights", layer).dtype == dtype
        within_rounding(trace.attention(layer), weights[0], dtype, f"layer {layer} attention")


def test_rms_norm_rounds_before_gamma_as_llama_does(folders):
    """transformers' LlamaRMSNorm: x / rms in float32, rounded to bfloat16, then times gamma in bfloat16. torch's
    own RMSNorm rounds once after gamma: the two differ in the last bit, which 30 layers make visible."""
    theirs, ours = _pair(folders, "llama", torch.bfloat16)
    seen = {}
    hook = theirs.model.layers[1].post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.update(y=o))
    with torch.no_grad():
        theirs(torch.tensor([IDS]))
    hook.remove()
    trace = ours.trace(IDS)
    assert torch.equal(trace.tensor("decoder.1.ln_mlp"), seen["y"][0])  # to the bit
    norm = ours.decoder.blocks[1].ln_mlp
    x = trace.tensor("decoder.1.resid_after_attn")
    assert not torch.equal(torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps), seen["y"][0])


@pytest.mark.parametrize("family", ["llama", "vit"])
def test_capture_does_not_change_the_output_in_bfloat16(folders, family):
    _, ours = _pair(folders, family, torch.bfloat16)
    with torch.inference_mode():
        if family == "vit":
            image = IMAGE.to(torch.bfloat16)
            plain, trace = ours(image[None])[0], ours.trace(image)
        else:
            plain, trace = ours(torch.tensor([IDS]))[0], ours.trace(IDS)
    assert torch.equal(trace.tensor("head.logits"), plain)
    # What a compact trace recomputes from Q and K is what the model computed: the same rule, in bfloat16.
    compact = trace.compact()
    for layer in range(trace.n_layers):
        assert torch.equal(compact.block_tensor("weights", layer), trace.block_tensor("weights", layer))
