"""What a model's config asks of one pass is bounded before any weight is read or downloaded (TFORMER_PASS_MB).

Found on a live server (issue 34): a ViT folder whose config.json said image size 1536 loaded (2 MB of weights,
within TFORMER_MAX_PARAMS) and its first picture took 255 s and grew the server from 1.36 to 6.05 GB; a DETR
whose preprocessor asked for 1,024-pixel pictures took 1.4 GB more; the loaders accepted 16,384-pixel ViTs and
4,096 / 8,192-pixel DETRs. Real checkpoints in tmp_path, saved by transformers from tiny configs; the hub is faked.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.test_checkpoint_failures import hub_online, into_hub_cache, spy_on_builds
from tests.core.test_mae_detr import save_tiny_detr, save_tiny_mae
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core import pass_memory, settings
from tformer_core.checkpoints import passes, vit
from tformer_core.models.detr import DETRConfig, DetrPreprocessing
from tformer_core.models.mae import MAEConfig


@pytest.fixture
def models_dir(tmp_path) -> Path:
    folder = tmp_path / "srv" / "models"
    folder.mkdir(parents=True)
    return folder


def save_vit(folder: Path, image_size: int, patch_size: int, hidden: int = 32, layers: int = 1, heads: int = 1) -> Path:
    """A random ViT classifier as transformers saves it, with a preprocessor for its own picture size."""
    torch.manual_seed(0)
    config = T.ViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        num_labels=3,
    )
    T.ViTForImageClassification(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": image_size, "width": image_size}}))
    return folder


def refused(folder: Path, models_dir: Path, *pieces: str) -> str:
    with pytest.raises(tc.CheckpointError) as caught:
        tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
    message = str(caught.value)
    for piece in pieces:
        assert piece in message, f"{piece!r} not in: {message}"
    assert str(models_dir) not in message and "\n" not in message
    return message


# ---- the estimate: numbers worked by hand, and never less than what a trace keeps -------------------------------


def test_the_estimate_of_a_tiny_encoder_worked_by_hand():
    config = tc.EncoderConfig(vocab_size=5, max_positions=3, n_layers=1, d_model=4, n_heads=2, d_ff=8, mlm_head=True)
    # One layer over T = 3 tokens, D = 4, H = 2 heads of 2, F = 8:
    #   attention weights kept: H * T * T = 18; per token: 8 D-wide vectors (32), q and z (2 * 4), k and v
    #   (2 * 4), the FFN's hidden units (8) = 56, so 3 * 56 = 168; embeddings and output: 4 * T * D = 48
    #   logits: T * vocab = 15; temporaries: scores, scaled and masked scores 3 * 18 = 54, FFN 2 * T * F = 48
    numbers = 18 + 168 + 48 + 15 + 54 + 48
    cost = pass_memory.pass_cost(config)
    assert cost.total == int(1.10 * 4 * numbers) == 1544  # 10 %: what the allocator keeps of the temporaries
    assert cost.attention == 4 * 18 and cost.input == "3 tokens"


@pytest.mark.parametrize("kind", ["encoder", "decoder", "seq2seq", "vit", "mae", "detr"])
def test_the_estimate_covers_everything_a_default_trace_keeps(kind, tmp_path):
    """The kept part of the estimate is at least the bytes of the trace of the largest input; the estimate's
    peak adds temporaries (benchmarks/memory.py compares it with a real pass's RSS)."""
    if kind == "encoder":
        model = tiny_encoder()
        trace = model.trace(list(range(1, 1 + model.config.max_positions)))
    elif kind == "decoder":
        model = tiny_decoder()
        trace = model.trace(list(range(1, 1 + model.config.max_positions)))
    elif kind == "seq2seq":
        model = tiny_seq2seq()
        n = model.config.max_positions
        trace = model.trace([1 + i % 20 for i in range(n)], [1 + i % 20 for i in range(n)])
    elif kind == "vit":
        model = tiny_vit()
        trace = model.trace(image())
    elif kind == "mae":
        model = tc.load_model(str(save_tiny_mae_folder(tmp_path)), device="cpu", model_dirs=[tmp_path])
        trace = model.trace(torch.randn(3, 16, 16), seed=0)
    else:
        save_tiny_detr(tmp_path / "detr")
        model = tc.load_model(str(tmp_path / "detr"), device="cpu", model_dirs=[tmp_path])
        W, H = pass_memory.detr_picture_size(model.preprocessing)
        trace = model.trace(torch.randn(3, H, W))
    cost = pass_memory.pass_cost(model.config, getattr(model, "preprocessing", None))
    assert trace.nbytes <= cost.total, (trace.nbytes, cost)


def save_tiny_mae_folder(root: Path) -> Path:
    save_tiny_mae(root / "mae")
    return root / "mae"


def test_the_largest_detr_picture_is_the_shortest_edge_times_the_longest():
    assert pass_memory.detr_picture_size(DetrPreprocessing(800, 1333)) == (1333, 800)
    assert pass_memory.detr_picture_size(DetrPreprocessing(1024, 1333)) == (1333, 1024)
    assert pass_memory.detr_picture_size(DetrPreprocessing(800, 600)) == (600, 600)  # longest < shortest: a square
    detr = DETRConfig(d_model=256, n_heads=8, d_ff=2048)
    at = {px: pass_memory.pass_cost(detr, DetrPreprocessing(px, 1333)) for px in (800, 1024, 1333)}
    assert at[800].input == "a 1,333 x 800 picture (1,050 feature cells)"  # 25 x 42 cells of 32 x 32 pixels
    assert at[800].total < at[1024].total < at[1333].total


def test_the_pages_models_fit_the_default_budget_and_their_larger_sizes_do_not():
    """The default (672 MB) admits every model the pages are made for at its own input, and refuses the sizes
    that once took the server past its memory."""
    budget = 672 * 2**20
    vit_b = dict(patch_size=16, n_layers=12, d_model=768, n_heads=12, d_ff=3072, n_classes=1000)
    assert pass_memory.pass_cost(tc.ViTConfig(image_size=224, **vit_b)).total < budget
    assert pass_memory.pass_cost(tc.ViTConfig(image_size=384, **vit_b)).total < budget
    assert pass_memory.pass_cost(tc.ViTConfig(image_size=1536, **vit_b)).total > 40 * budget
    mae_base = MAEConfig(image_size=224, patch_size=16, n_layers=12, d_model=768, n_heads=12, d_ff=3072)
    assert pass_memory.pass_cost(mae_base).total < budget
    detr_r50 = DETRConfig(d_model=256, n_heads=8, d_ff=2048)
    assert pass_memory.pass_cost(detr_r50, DetrPreprocessing(800, 1333)).total < budget
    assert pass_memory.pass_cost(detr_r50, DetrPreprocessing(4096, 8192)).total > 10 * budget
    bert_base = tc.EncoderConfig(vocab_size=30522, n_layers=12, d_model=768, n_heads=12, d_ff=3072, mlm_head=True)
    gpt2 = tc.DecoderConfig(vocab_size=50257, max_positions=1024, n_layers=12, d_model=768, n_heads=12, d_ff=3072)
    t5_small = tc.Seq2SeqConfig(
        src_vocab_size=32128, tgt_vocab_size=32128, n_encoder_layers=6, n_decoder_layers=6, d_model=512, n_heads=8
    )
    for config in (bert_base, gpt2, t5_small):
        assert pass_memory.tokens_within(config, budget) == 512, config
    smollm2 = tc.LlamaConfig(
        vocab_size=49152, max_positions=8192, n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536
    )
    assert pass_memory.tokens_within(smollm2, budget) == 362  # a full trace at 512 tokens: about 0.85 GB, measured


# ---- the loaders: refused before any weight is read ------------------------------------------------------------


def test_a_vit_made_for_1536_pixel_pictures_is_refused_before_it_is_built(models_dir, monkeypatch):
    """The reported case: 2 MB of weights, within TFORMER_MAX_PARAMS; its first picture took 255 s and 4.7 GB."""
    folder = save_vit(models_dir / "vit1536", 1536, 16)
    built = spy_on_builds(monkeypatch, vit, "ViT")
    message = refused(
        folder,
        models_dir,
        "models/vit1536: one pass over a 1,536 x 1,536 picture (9,217 tokens) would take about",
        "one layer's attention alone 324 MB",
        "the limit is 672 MB (the setting TFORMER_PASS_MB)",
    )
    assert built == ["meta"], "the model was built for real"
    assert "Traceback" not in message


def test_the_largest_sizes_the_loaders_accepted_are_refused(models_dir, monkeypatch):
    """16,384-pixel ViTs (a few MB of weights with 128-pixel patches) and 4,096 / 8,192-pixel DETRs loaded."""
    save_vit(models_dir / "vit16k", 16384, 128)
    refused(models_dir / "vit16k", models_dir, "a 16,384 x 16,384 picture (16,385 tokens)", "TFORMER_PASS_MB")
    save_tiny_detr(models_dir / "detr8k", stages=4)
    (models_dir / "detr8k" / "preprocessor_config.json").write_text(
        json.dumps({"size": {"shortest_edge": 4096, "longest_edge": 8192}})
    )
    refused(models_dir / "detr8k", models_dir, "a 8,192 x 4,096 picture (32,768 feature cells)", "TFORMER_PASS_MB")


def test_a_detrs_preprocessor_decides_its_pass_and_the_setting_moves_the_line(models_dir, monkeypatch):
    """A DETR asking for 1,024-pixel pictures took 1.4 GB on the server: its pass is counted at its own size."""
    save_tiny_detr(models_dir / "detr", stages=4)  # one feature cell per 32 x 32 pixels, as ResNet-50's
    sizes = {"size": {"shortest_edge": 1024, "longest_edge": 1333}}
    (models_dir / "detr" / "preprocessor_config.json").write_text(json.dumps(sizes))
    config, pre = passes.core_config(json.loads((models_dir / "detr" / "config.json").read_text()), sizes)
    cost = pass_memory.pass_cost(config, pre)
    assert cost.input == "a 1,333 x 1,024 picture (1,344 feature cells)"
    assert tc.load_model(str(models_dir / "detr"), device="cpu", model_dirs=[models_dir]).pass_tokens is None
    monkeypatch.setenv("TFORMER_PASS_MB", str(cost.total / 2**20 * 0.9))
    refused(models_dir / "detr", models_dir, "a 1,333 x 1,024 picture", "(the setting TFORMER_PASS_MB)")
    monkeypatch.setenv("TFORMER_PASS_MB", str(cost.total / 2**20 * 1.1))
    assert tc.load_model(str(models_dir / "detr"), device="cpu", model_dirs=[models_dir]) is not None


def test_a_text_model_reads_the_tokens_its_pass_allows_and_says_so(models_dir, monkeypatch):
    """A text model's input is the user's: it keeps the tokens whose pass fits, and is refused below 64."""
    torch.manual_seed(0)
    config = T.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=1024, bos_token_id=0, eos_token_id=0
    )
    T.GPT2LMHeadModel(config).save_pretrained(models_dir / "gpt2")
    model = tc.load_model(str(models_dir / "gpt2"), device="cpu", model_dirs=[models_dir])
    assert model.pass_tokens == 512 and model.token_limit == 512 and model.max_tokens == 1024
    core = model.config
    at_300 = pass_memory.pass_cost(core, tokens=300).total
    monkeypatch.setenv("TFORMER_PASS_MB", str(at_300 / 2**20))
    model = tc.load_model(str(models_dir / "gpt2"), device="cpu", model_dirs=[models_dir])
    assert model.pass_tokens == 300 and model.token_limit == 300
    assert len(model.trace([i % 99 for i in range(300)]).tokens) == 300  # 300 tokens: one pass
    with pytest.raises(tc.InputError, match=r"301 tokens; one pass of this model reads at most 300 .*TFORMER_PASS_MB"):
        model.trace([i % 99 for i in range(301)])
    monkeypatch.setenv("TFORMER_PASS_MB", str(pass_memory.pass_cost(core, tokens=63).total / 2**20))
    refused(models_dir / "gpt2", models_dir, "one pass over as few as 64 tokens would take", "TFORMER_PASS_MB")


def test_the_pass_budget_is_a_setting(models_dir, monkeypatch, caplog):
    assert settings.SETTINGS["TFORMER_PASS_MB"].default == 672
    folder = save_vit(models_dir / "vit", 64, 16)
    monkeypatch.setenv("TFORMER_PASS_MB", "0.001")
    refused(folder, models_dir, "a 64 x 64 picture (17 tokens)", "the limit is 0.0 MB")
    monkeypatch.setenv("TFORMER_PASS_MB", "plenty")
    with caplog.at_level("WARNING", logger="tformer_core"):
        assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None
    assert "TFORMER_PASS_MB='plenty' is refused (not a number); using 672" in caplog.text


def test_a_model_transformers_runs_is_checked_too(models_dir, monkeypatch):
    """The fallback (an architecture the core does not implement) is estimated from config.json's sizes."""
    torch.manual_seed(0)
    config = T.ElectraConfig(
        vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=512,
    )  # fmt: skip
    T.ElectraForMaskedLM(config).save_pretrained(models_dir / "electra")
    model = tc.load_model(str(models_dir / "electra"), device="cpu", model_dirs=[models_dir])
    assert model.path == "transformers" and model.pass_tokens == 512
    monkeypatch.setenv("TFORMER_PASS_MB", "0.01")
    refused(models_dir / "electra", models_dir, "one pass over as few as 64 tokens", "TFORMER_PASS_MB")


# ---- the hub: the config files first, the weights only when a pass fits -----------------------------------------


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """HfApi.model_info and hf_hub_download replaced; files are served from `state.folder`."""
    import huggingface_hub

    hub_online(monkeypatch, tmp_path)
    state = SimpleNamespace(folder=None, downloads=[])

    def model_info(self, repo_id, **kwargs):
        siblings = [SimpleNamespace(rfilename=p.name, size=p.stat().st_size) for p in state.folder.iterdir()]
        return SimpleNamespace(sha="0" * 40, siblings=siblings, safetensors=None)

    def hf_hub_download(repo_id, filename, **kwargs):
        state.downloads.append(filename)
        return into_hub_cache(repo_id, filename, state.folder / filename)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return state


def test_a_hub_model_whose_pass_is_too_large_is_refused_before_its_weights_download(fake_hub, tmp_path):
    fake_hub.folder = save_vit(tmp_path / "served-vit", 1536, 16)
    with pytest.raises(tc.CheckpointError) as caught:
        tc.load_model("someone/vit-1536", device="cpu")
    assert "someone/vit-1536: one pass over a 1,536 x 1,536 picture" in str(caught.value)
    assert "TFORMER_PASS_MB" in str(caught.value)
    assert sorted(fake_hub.downloads) == ["config.json", "preprocessor_config.json"]  # no weights
    fake_hub.downloads.clear()
    fake_hub.folder = tmp_path / "served-detr"
    save_tiny_detr(fake_hub.folder)
    sizes = {"size": {"shortest_edge": 4096, "longest_edge": 8192}}
    (fake_hub.folder / "preprocessor_config.json").write_text(json.dumps(sizes))
    with pytest.raises(tc.CheckpointError, match="someone/detr-8k: one pass over a 8,192 x 4,096 picture"):
        tc.load_model("someone/detr-8k", device="cpu")
    assert sorted(fake_hub.downloads) == ["config.json", "preprocessor_config.json"]


def test_a_hub_model_whose_pass_fits_downloads_and_loads(fake_hub, tmp_path):
    fake_hub.folder = save_vit(tmp_path / "served-vit", 64, 16)
    model = tc.load_model("someone/vit-64", device="cpu")
    assert model.config.image_hw == (64, 64)
    assert sorted(fake_hub.downloads[:2]) == ["config.json", "preprocessor_config.json"]  # first
    assert "model.safetensors" in fake_hub.downloads
