"""Every way a checkpoint can be broken gives a CheckpointError that names the file and the problem, shows no
server path, and allocates nothing big before it fails. Real files in tmp_path: tiny models saved by
transformers, then damaged (cut, overwritten, re-typed, pickled with a payload). No network: hub calls are
replaced by fakes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import struct
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import tformer_core as tc
from tformer_core import settings
from tformer_core.checkpoints import bert, hub_disk, sources

# ---- tiny checkpoints, made once, copied for each test ---------------------------------------------------------

BERT = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
)


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, Path]:
    """Tiny BERT, GPT-2, ViT and BART checkpoints as transformers saves them."""
    root = tmp_path_factory.mktemp("templates")
    torch.manual_seed(0)
    models = {
        "bert": T.BertForMaskedLM(T.BertConfig(**BERT)),
        "gpt2": T.GPT2LMHeadModel(T.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        "vit": T.ViTForImageClassification(
            T.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=37,
                num_labels=3,
            )
        ),
        "bart": T.BartForConditionalGeneration(
            T.BartConfig(
                vocab_size=50,
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                max_position_embeddings=32,
            )
        ),
    }
    folders = {}
    for name, model in models.items():
        folders[name] = root / name
        model.save_pretrained(folders[name])
    return folders


@pytest.fixture
def models_dir(tmp_path) -> Path:
    """The one configured model folder of a test, named "models" as on the server."""
    folder = tmp_path / "srv" / "models"
    folder.mkdir(parents=True)
    return folder


def copy(templates, name: str, models_dir: Path, as_name: str = "m") -> Path:
    return Path(shutil.copytree(templates[name], models_dir / as_name))


def edit_config(folder: Path, file: str = "config.json", **changes) -> None:
    """Set (or, with ..., remove) keys of a JSON file in `folder`."""
    path = folder / file
    values = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in changes.items():
        if value is ...:
            values.pop(key, None)
        else:
            values[key] = value
    path.write_text(json.dumps(values))


def assert_clean(message: str, *paths: Path) -> None:
    """One line for a person: no traceback, no server path (the test's folders, resolved or not)."""
    assert "Traceback" not in message and "\n" not in message, message
    for path in paths:
        for shown in {str(path), str(path.resolve()), os.path.realpath(path)}:
            assert shown not in message, f"server path {shown} in: {message}"
    assert not re.search(r"(^|[\s'\"(])/(tmp|home|work|srv|root|etc|usr|var)\b", message), message


def refused(source: str | Path, models_dir: Path, *expected: str) -> str:
    """load_model(source) raises CheckpointError whose message holds every expected piece and no server path."""
    with pytest.raises(tc.CheckpointError) as caught:
        tc.load_model(str(source), device="cpu", model_dirs=[models_dir])
    message = str(caught.value)
    for piece in expected:
        assert piece in message, f"{piece!r} not in: {message}"
    assert_clean(message, models_dir.parent)
    return message


def test_the_tiny_templates_load(templates, models_dir):
    for name in templates:
        folder = copy(templates, name, models_dir, name)
        assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None


# ---- 1. damaged weights --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda data: b"12345678", "not a safetensors file"),  # 8 bytes that announce an enormous header
        (lambda data: b"\x00" * 3, "too short"),
        (lambda data: os.urandom(0) + b"garbage!" * 40, "not a safetensors file"),
        (lambda data: data[:100], "truncated"),  # the header itself is cut
        (lambda data: data[: len(data) // 2], "truncated"),  # header whole, data cut: "was a download interrupted?"
        (lambda data: struct.pack("<Q", 10) + b'{"a": 1}  ', "not a tensor description"),
        (lambda data: struct.pack("<Q", 2) + b"[]", "not a table of tensors"),
    ],
    ids=["8-bytes", "3-bytes", "garbage", "cut-header", "cut-data", "bad-entry", "list-header"],
)
def test_a_damaged_safetensors_file_is_named(templates, models_dir, damage, problem):
    folder = copy(templates, "bert", models_dir)
    path = folder / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    refused(folder, models_dir, "model.safetensors", problem)


def _raw_safetensors(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_header_whose_offsets_do_not_match_the_shapes_is_damaged(templates, models_dir):
    folder = copy(templates, "bert", models_dir)
    header = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 8]}}  # 16 floats need 64 bytes
    _raw_safetensors(folder / "model.safetensors", header, b"0" * 8)
    refused(folder, models_dir, "model.safetensors is damaged", "does not match its shape")


def test_an_unknown_number_format_is_named(templates, models_dir):
    folder = copy(templates, "bert", models_dir)
    _raw_safetensors(folder / "model.safetensors", {"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, b"00")
    refused(folder, models_dir, "model.safetensors", "'Q7'", "number format tformer cannot read")


def test_no_weights_at_all(templates, models_dir):
    folder = copy(templates, "bert", models_dir)
    (folder / "model.safetensors").unlink()
    refused(folder, models_dir, "no weights", "model.safetensors", "pytorch_model.bin")


# ---- 1. pickles -----------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this would create a file: proof that a pickle's code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _bin_folder(templates, models_dir) -> Path:
    folder = copy(templates, "bert", models_dir)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_plain_pytorch_bin_loads_like_safetensors(templates, models_dir):
    folder = _bin_folder(templates, models_dir)
    ours = tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
    reference = tc.load_model(str(copy(templates, "bert", models_dir, "ref")), device="cpu", model_dirs=[models_dir])
    for (name, a), (_, b) in zip(ours.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "writer, expected",
    [
        (lambda state, path: torch.save(state, path), "Python objects besides tensors"),
        (lambda state, path: torch.save(state, path, _use_new_zipfile_serialization=False), "Python objects"),
        (lambda state, path: path.write_bytes(pickle.dumps(state, protocol=2)), "pytorch_model.bin"),
    ],
    ids=["zip-format", "legacy-format", "plain-pickle"],
)
def test_a_pickle_with_a_payload_is_refused_and_its_code_never_runs(templates, models_dir, tmp_path, writer, expected):
    folder = _bin_folder(templates, models_dir)
    marker = tmp_path / "payload-ran"
    state = {"bert.embeddings.word_embeddings.weight": torch.zeros(99, 32), "evil": _Payload(marker)}
    writer(state, folder / "pytorch_model.bin")
    message = refused(folder, models_dir, "pytorch_model.bin", expected)
    assert not marker.exists(), "the pickle's payload ran"
    assert "Unsupported global" not in message and "weights_only" not in message  # PyTorch's words for developers


class _SystemPayload:
    """A pickle calling os.system: torch 2.13 refuses it with "... whose module posix is blocked"."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_calling_a_blocked_module_is_named_as_refused_not_as_damaged(templates, models_dir, tmp_path):
    folder = _bin_folder(templates, models_dir)
    marker = tmp_path / "payload-ran"
    torch.save(
        {"bert.embeddings.word_embeddings.weight": torch.zeros(99, 32), "evil": _SystemPayload(marker)},
        folder / "pytorch_model.bin",
    )
    message = refused(folder, models_dir, "pytorch_model.bin holds Python objects besides tensors")
    assert "damaged" not in message and "posix" not in message and not marker.exists()


def test_a_weights_file_linking_outside_the_model_folders_is_refused_unread(templates, models_dir, tmp_path):
    """The folder is inside the configured one; its weights file is a link to a file elsewhere (a secret, say).
    It is refused before any file is read, and the message names the file, not where it leads."""
    folder = copy(templates, "bert", models_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.safetensors").write_bytes(b"SECRET!!" + b"x" * 100)  # its 8 bytes as a length: a number
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(elsewhere / "secret.safetensors")
    message = refused(folder, models_dir, "models/m/model.safetensors is a link to a file outside", "refused")
    assert "elsewhere" not in message and "secret" not in message
    (folder / "model.safetensors").unlink()  # the same bytes inside the folder: damaged, and the number not shown
    (folder / "model.safetensors").write_bytes((elsewhere / "secret.safetensors").read_bytes())
    n = int.from_bytes(b"SECRET!!", "little")
    message = refused(folder, models_dir, "model.safetensors is damaged or is not a safetensors file")
    assert str(n) not in message and f"{n:,}" not in message, message


def test_a_refusal_keeps_its_cause_for_the_operator(templates, models_dir):
    """The message is for the user; the exception it was written for stays attached (raise ... from cause), so
    the server's log can say what happened (an OSError, a JSON error) without the user seeing it."""
    folder = copy(templates, "bert", models_dir)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(tc.CheckpointError, match=r"^config\.json is not valid JSON \(Expecting") as caught:
        tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    with pytest.raises(tc.CheckpointError, match="control characters") as caught:
        tc.load_model("./models/m\x00/../../etc", device="cpu", model_dirs=[models_dir])
    assert "\x00" not in str(caught.value)


@pytest.mark.parametrize(
    "damage", [lambda data: b"not a pickle at all", lambda data: data[: len(data) // 3]], ids=["garbage", "cut"]
)
def test_a_damaged_pytorch_bin_is_named(templates, models_dir, damage):
    folder = _bin_folder(templates, models_dir)
    path = folder / "pytorch_model.bin"
    path.write_bytes(damage(path.read_bytes()))
    refused(folder, models_dir, "pytorch_model.bin", "damaged")


def test_a_pytorch_bin_without_named_tensors(templates, models_dir):
    folder = _bin_folder(templates, models_dir)
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")
    refused(folder, models_dir, "pytorch_model.bin", "table of named tensors")


def test_a_pytorch_bin_too_large_for_the_limit_is_refused_before_it_is_unpickled(templates, models_dir, monkeypatch):
    folder = _bin_folder(templates, models_dir)
    monkeypatch.setenv("TFORMER_MAX_PARAMS", "1000")  # 4 kB of float32; the file is about 40 kB
    unpickled = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: unpickled.append(a) or {})
    refused(folder, models_dir, "pytorch_model.bin", "1,000", "TFORMER_MAX_PARAMS")
    assert not unpickled


# ---- 1. config.json ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"hidden_size": "abc"}, "config.json: hidden_size must be a positive whole number, got 'abc'"),
        ({"hidden_size": 0}, "config.json: hidden_size must be a positive whole number, got 0"),
        ({"hidden_size": -32}, "config.json: hidden_size must be a positive whole number, got -32"),
        ({"hidden_size": 32.5}, "config.json: hidden_size must be a positive whole number, got 32.5"),
        ({"hidden_size": True}, "config.json: hidden_size must be a positive whole number, got True"),
        ({"hidden_size": [32]}, "config.json: hidden_size must be a positive whole number, got [32]"),
        ({"hidden_size": ...}, "config.json has no hidden_size"),
        ({"num_attention_heads": ...}, "config.json has no num_attention_heads"),
        ({"num_attention_heads": 5}, "config.json: num_attention_heads (5) must divide hidden_size (32)"),
        ({"num_hidden_layers": 10**6}, "config.json: num_hidden_layers is 1,000,000: more than tformer handles"),
        ({"vocab_size": 10**12}, "config.json: vocab_size is 1,000,000,000,000: more than tformer handles"),
        ({"layer_norm_eps": "tiny"}, "config.json: layer_norm_eps must be a number, got 'tiny'"),
        ({"layer_norm_eps": -1}, "config.json: layer_norm_eps must be a positive number"),
        ({"hidden_act": "mish"}, "config.json: hidden_act 'mish' is not supported yet"),
        ({"hidden_act": 3}, "config.json: hidden_act must be a name"),
        ({"type_vocab_size": -1}, "config.json: type_vocab_size must be at least 0"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported yet"),
        ({"model_type": ...}, "config.json has no model_type"),
        ({"model_type": ["bert"]}, "not supported yet"),
        ({"model_type": "surely-not-a-model"}, "not supported yet: surely-not-a-model"),
        ({"model_type": "mamba"}, "BertForMaskedLM, which is not a mamba architecture"),
    ],
    ids=lambda v: "-".join(f"{k}={v!r}"[:30] for k, v in v.items()) if isinstance(v, dict) else None,
)
def test_a_wrong_config_value_is_named(templates, models_dir, changes, expected):
    folder = copy(templates, "bert", models_dir)
    edit_config(folder, **changes)
    refused(folder, models_dir, expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{not json", "config.json is not valid JSON (Expecting property name"),
        ("[1, 2]", "config.json must hold a JSON object"),
        ('"bert"', "config.json must hold a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "config.json is not a usable JSON file"),
        ("\udcff", "config.json is not a text file"),
    ],
    ids=["broken", "list", "string", "deeply-nested", "binary"],
)
def test_a_config_that_is_not_a_json_object_is_named(templates, models_dir, text, expected):
    folder = copy(templates, "bert", models_dir)
    (folder / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    refused(folder, models_dir, expected)


def test_any_value_of_any_kind_in_config_json_gives_a_checkpoint_error_or_a_model(templates, models_dir):
    """Every key of each family's config.json set to wrong values of every kind (three per key, in turn, so
    that each kind meets keys of every sort and the test stays short): never another exception."""
    wrong = [None, "abc", -1, 0, 2.5, True, [], {}, [1, 2], 10**9, 1e30]
    tried = 0
    for family in ("bert", "gpt2", "vit", "bart"):
        folder = copy(templates, family, models_dir, family)
        original = json.loads((folder / "config.json").read_text())
        for key in original:
            for value in (wrong[tried % len(wrong)], wrong[(tried + 4) % len(wrong)], wrong[(tried + 8) % len(wrong)]):
                edit_config(folder, **{key: value})
                try:
                    tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
                except tc.CheckpointError as error:
                    assert_clean(str(error), models_dir.parent)
                (folder / "config.json").write_text(json.dumps(original))
            tried += 1
    assert tried > 100


# ---- 2. sizes: validated before anything is allocated ---------------------------------------------------------


HUGE = dict(hidden_size=16384, num_hidden_layers=200, intermediate_size=65536, num_attention_heads=128)


def spy_on_builds(monkeypatch, module=bert, name: str = "Encoder") -> list[str]:
    """The device each core model `module.name` (a loader's, default BERT's Encoder) is built on: "meta" for the
    dry run, "cpu" for real."""
    built: list[str] = []
    real = getattr(module, name)

    def spy(config):
        built.append(torch.get_default_device().type)
        return real(config)

    monkeypatch.setattr(module, name, spy)
    return built


@pytest.mark.parametrize("weights_file", ["8 bytes", "the tiny model's"])
def test_a_huge_config_fails_before_anything_is_allocated(templates, models_dir, monkeypatch, weights_file):
    """The reported case: a config declaring a huge model with an 8-byte weights file allocated 5.45 GB."""
    folder = copy(templates, "bert", models_dir)
    edit_config(folder, **HUGE)
    if weights_file == "8 bytes":
        (folder / "model.safetensors").write_bytes(b"\x00" * 8)
    built = spy_on_builds(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(tc.CheckpointError) as caught:
            tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert_clean(message, models_dir.parent)
    assert peak < 30e6, f"{peak / 1e6:.0f} MB traced while refusing"
    assert "cpu" not in built, "a real module was built"
    if weights_file == "8 bytes":
        # refused at the header, before any module
        assert "model.safetensors is damaged or is not a safetensors file" in message and not built
    else:
        assert built == ["meta"]
        for piece in ("644.6 billion parameters", "250 million", "TFORMER_MAX_PARAMS"):
            assert piece in message, message


def test_a_config_within_the_limit_that_does_not_match_the_weights_builds_nothing(templates, models_dir, monkeypatch):
    folder = copy(templates, "bert", models_dir)
    edit_config(folder, hidden_size=1024, intermediate_size=4096, num_attention_heads=16)
    built = spy_on_builds(monkeypatch)
    expected = "model.safetensors: the tensor bert.embeddings.word_embeddings.weight is (99, 32)"
    refused(folder, models_dir, expected, "config.json implies (99, 1024)")
    assert built == ["meta"]


def test_the_parameter_limit_is_a_setting(templates, models_dir, monkeypatch, caplog):
    folder = copy(templates, "bert", models_dir)
    assert settings.SETTINGS["TFORMER_MAX_PARAMS"].default == 250e6
    monkeypatch.setenv("TFORMER_MAX_PARAMS", "5e3")
    refused(folder, models_dir, "parameters", "the limit is 5,000", "TFORMER_MAX_PARAMS")
    # A bad value breaks no load: it is logged once, and the default limit (250 million) applies.
    monkeypatch.setenv("TFORMER_MAX_PARAMS", "lots of them")
    with caplog.at_level("WARNING", logger="tformer_core"):
        assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None
        assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None
    lines = [r.getMessage() for r in caplog.records if "TFORMER_MAX_PARAMS" in r.getMessage()]
    assert lines == ["TFORMER_MAX_PARAMS='lots of them' is refused (not a number); using 2.5e+08"]
    monkeypatch.setenv("TFORMER_MAX_PARAMS", "1e6")
    assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None


# ---- 6. shards, number formats, other files --------------------------------------------------------------------


def test_a_sharded_checkpoint_loads_and_a_missing_shard_is_named(templates, models_dir):
    model = T.BertForMaskedLM.from_pretrained(templates["bert"])
    folder = models_dir / "sharded"
    model.save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    assert tc.load_model(str(folder), device="cpu", model_dirs=[models_dir]) is not None
    shards[-1].unlink()
    refused(folder, models_dir, f"model.safetensors.index.json names {shards[-1].name}", "not in the model folder")


@pytest.mark.parametrize(
    "weight_map, expected",
    [
        ({"a": "../../etc/x.safetensors"}, "the shard 'x.safetensors' is not named as a file in the model folder"),
        ({"a": "/etc/x.safetensors"}, "the shard 'x.safetensors' is not named as a file in the model folder"),
        ({"a": "config.json"}, "names config.json, which is not a .safetensors file"),
        ({"nope": "model-00001-of-00001.safetensors"}, "says model-00001-of-00001.safetensors holds the tensor nope"),
        ("oops", "has no weight_map"),
    ],
    ids=["climbs", "absolute", "not-weights", "wrong-tensor", "no-map"],
)
def test_a_shard_index_pointing_elsewhere_is_refused(templates, models_dir, weight_map, expected):
    folder = copy(templates, "bert", models_dir)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    refused(folder, models_dir, "model.safetensors.index.json", expected)


def _retyped(folder: Path, change) -> None:
    state = load_file(folder / "model.safetensors")
    save_file({k: change(k, v) for k, v in state.items()}, folder / "model.safetensors")


def test_float64_and_bfloat16_weights_are_converted(templates, models_dir):
    reference = tc.load_model(str(copy(templates, "bert", models_dir, "ref")), device="cpu", model_dirs=[models_dir])
    for dtype in (torch.float64, torch.bfloat16):
        folder = copy(templates, "bert", models_dir, str(dtype))
        _retyped(folder, lambda k, v, dtype=dtype: v.to(dtype))
        model = tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
        for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, b, atol=1e-2 if dtype == torch.bfloat16 else 0, rtol=1e-2), name


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda v: v.to(torch.int64), "holds int64 values; a weight must hold floating-point numbers"),
        (lambda v: v > 0, "holds bool values"),
        (lambda v: v.clone().fill_(float("nan")), "holds NaN or infinite values"),
        (lambda v: v.clone().fill_(float("inf")), "holds NaN or infinite values"),
    ],
    ids=["int64", "bool", "nan", "inf"],
)
def test_weights_that_are_not_finite_floats_are_named(templates, models_dir, change, expected):
    folder = copy(templates, "bert", models_dir)
    name = "bert.encoder.layer.1.attention.self.query.weight"
    _retyped(folder, lambda k, v: change(v) if k == name else v)
    refused(folder, models_dir, f"model.safetensors: the tensor {name}", expected)


def test_generation_config_that_is_not_json_or_holds_wrong_ids(templates, models_dir):
    folder = copy(templates, "bart", models_dir)
    (folder / "generation_config.json").write_text("{'eos': 2}")
    refused(folder, models_dir, "generation_config.json is not valid JSON")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "two"}))
    refused(folder, models_dir, "generation_config.json: eos_token_id must be a token id", "'two'")
    (folder / "generation_config.json").write_text(json.dumps({"max_length": "long"}))
    refused(folder, models_dir, "generation_config.json: max_length must be a whole number")
    (folder / "generation_config.json").write_text(json.dumps({"decoder_start_token_id": 5000}))
    refused(folder, models_dir, "decoder_start_token_id (or bos_token_id) is 5000, but the model has only 50 tokens")
    (folder / "generation_config.json").write_text(json.dumps({"bad_words_ids": [[1], ["x"]]}))
    refused(folder, models_dir, "generation_config.json: bad_words_ids must be a token id")


def _with_tokenizer(templates, models_dir) -> Path:
    folder = copy(templates, "bert", models_dir)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
    words += [f"w{i}" for i in range(99 - len(words))]
    T.BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")  # as older checkpoints ship it, beside the rest
    return folder


def test_a_checkpoint_with_its_tokenizer_loads(templates, models_dir):
    folder = _with_tokenizer(templates, models_dir)
    model = tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
    assert model.trace("the cat sat").tokens == ("[CLS]", "the", "cat", "sat", "[SEP]")


@pytest.mark.parametrize(
    "file, content, expected",
    [
        ("tokenizer.json", b'{"version": "1.0", "model": ', "tokenizer.json is not valid JSON"),
        ("tokenizer_config.json", b"[1, 2", "tokenizer_config.json is not valid JSON"),
        ("special_tokens_map.json", b"[]", "special_tokens_map.json must hold a JSON object"),
        ("vocab.txt", b"\xff\xfe\x00bad", "vocab.txt is damaged: it is not UTF-8 text"),
        ("tokenizer.json", b'{"model": {"type": "Nonsense"}}', "the tokenizer files"),
    ],
    ids=["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "nonsense"],
)
def test_damaged_tokenizer_files_are_named(templates, models_dir, file, content, expected):
    folder = _with_tokenizer(templates, models_dir)
    (folder / file).write_bytes(content)
    refused(folder, models_dir, expected)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"size": "big"}, "preprocessor_config.json: size must be a positive whole number"),
        ({"size": {"wide": 3}}, "preprocessor_config.json: size must give height and width"),
        ({"image_mean": [0.5, 0.5]}, "image_mean must be a list of 3 numbers"),
        ({"image_std": [0.5, 0, 0.5]}, "image_std must be positive numbers"),
        ({"size": {"height": 64, "width": 64}}, "pictures of 64x64 pixels, but config.json's image_size is 32x32"),
        ({"do_resize": False}, "pictures of varying size"),
        ({"resample": 99}, "resample is 99"),
    ],
    ids=["size-text", "size-keys", "mean", "std", "wrong-size", "no-resize", "resample"],
)
def test_a_wrong_preprocessor_config_is_named(templates, models_dir, changes, expected):
    folder = copy(templates, "vit", models_dir)
    edit_config(folder, "preprocessor_config.json", **{"size": {"height": 32, "width": 32}, **changes})
    refused(folder, models_dir, expected)


def test_a_vit_config_with_patches_that_do_not_tile_the_picture(templates, models_dir):
    folder = copy(templates, "vit", models_dir)
    edit_config(folder, image_size=30)
    refused(folder, models_dir, "config.json: image_size 30 is not a whole number of patches of patch_size 8")


def test_a_model_that_does_not_fit_on_the_device_says_so(templates, models_dir, monkeypatch):
    folder = copy(templates, "bert", models_dir)

    def out_of_memory(self, device=None, dtype=None):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")

    monkeypatch.setattr(tc.TracedModel, "place", out_of_memory)
    refused(folder, models_dir, "models/m does not fit in the memory of cpu")


def test_a_damaged_bundled_model_is_named_without_server_paths(monkeypatch, tmp_path):
    from tformer_core import bundled

    assets = tmp_path / "assets"
    shutil.copytree(bundled.asset_dir("vit-tiny"), assets / "vit-tiny")
    monkeypatch.setattr(bundled.loading, "ASSETS_DIR", assets)
    weights_file = assets / "vit-tiny" / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:5000])
    with pytest.raises(tc.CheckpointError, match=r"model\.safetensors is damaged") as caught:
        tc.load_model("vit-tiny", device="cpu")
    assert_clean(str(caught.value), tmp_path)
    (assets / "vit-tiny" / "config.json").write_text("{")
    with pytest.raises(tc.CheckpointError, match=r"config\.json is not valid JSON") as caught:
        tc.load_model("vit-tiny", device="cpu")
    assert_clean(str(caught.value), tmp_path)
    (assets / "vit-tiny" / "config.json").write_text(json.dumps({"family": "vit", "config": {"n_layers": "x"}}))
    with pytest.raises(tc.CheckpointError, match="does not describe a vit model") as caught:
        tc.load_model("vit-tiny", device="cpu")
    assert_clean(str(caught.value), tmp_path)


# ---- 3, 4. local paths: decided from the string, named relative to the model folders ---------------------------


SERVER_MODELS = "/srv/models"  # the configured folder of the string-only tests; it need not exist


@contextlib.contextmanager
def no_filesystem():
    """Inside the block, any look at the filesystem outside the configured model folder fails the test
    (only there: pytest itself reads files to report a failure)."""

    def guarded(original):
        def check(*args, **kwargs):
            path = str(args[0]) if args else ""
            # the configured folder may be resolved (its own links followed): it and what leads to it are allowed
            if not (SERVER_MODELS.startswith(path) or path.startswith(SERVER_MODELS + "/")):
                raise AssertionError(f"the filesystem was consulted about {path}")
            return original(*args, **kwargs)

        return check

    with contextlib.ExitStack() as stack:
        for name in ("exists", "is_dir", "is_file", "resolve", "stat", "lstat", "iterdir", "glob"):
            stack.enter_context(mock.patch.object(Path, name, guarded(getattr(Path, name))))
        for name in ("stat", "lstat"):
            stack.enter_context(mock.patch.object(os, name, guarded(getattr(os, name))))
        yield


@pytest.mark.parametrize(
    "source, is_path",
    [
        ("/etc/passwd", True),
        ("./models/m", True),
        ("../shared/models/m", True),
        ("~/models/m", True),
        ("models/deit-tiny-patch16-224", True),  # starts with a configured folder's label
        ("models", True),
        ("google/vit-base-patch16-224", False),
        ("gpt2", False),
        ("modelsx/m", False),
        ("etc/passwd", False),  # not a configured folder: a hub id (it will not be found there)
    ],
)
def test_paths_and_hub_ids_are_told_apart_from_the_string_alone(source, is_path):
    with no_filesystem():
        answer = sources.looks_like_path(source, [SERVER_MODELS])
    assert answer is is_path


@pytest.mark.parametrize("outside", ["/etc/passwd", "/etc/surely/not/there", "../../../etc", "~root", "models/../../e"])
def test_a_path_outside_the_model_folders_is_refused_without_looking_and_without_echo(outside):
    with pytest.raises(tc.CheckpointError) as caught, no_filesystem():
        sources.local_folder(outside, [SERVER_MODELS])
    message = str(caught.value)
    assert "outside them" in message and "(models)" in message
    assert "etc" not in message and "root" not in message and "/srv" not in message
    # the same words whether or not the path exists: the message reveals nothing about the server's files
    with pytest.raises(tc.CheckpointError) as elsewhere:
        sources.local_folder("/nowhere", [SERVER_MODELS])
    assert message == str(elsewhere.value)


def test_local_models_have_short_names_that_load(templates, models_dir):
    folder = copy(templates, "bert", models_dir, "tiny-bert")
    assert sources.display_name(folder, [models_dir]) == "models/tiny-bert"
    assert sources.local_model_names([models_dir]) == ["models/tiny-bert"]
    assert sources.local_models([models_dir]) == [("models/tiny-bert", folder)]
    assert sources.local_folder("models/tiny-bert", [models_dir]) == folder.resolve()
    model = tc.load_model("models/tiny-bert", device="cpu", model_dirs=[models_dir])
    assert model.source == "models/tiny-bert"
    by_path = tc.load_model(str(folder), device="cpu", model_dirs=[models_dir])
    assert by_path.source == "models/tiny-bert"  # what pages show and put in links: never the server path
    refused("models/not-there", models_dir, "there is no model folder models/not-there")
    (models_dir / "empty").mkdir()
    refused("models/empty", models_dir, "models/empty has no config.json")
    with pytest.raises(tc.CheckpointError, match=r"model folders \(models\); this path is outside them"):
        sources.display_name(models_dir.parent / "elsewhere", [models_dir])


def test_two_model_folders_of_the_same_name_are_told_apart(templates, tmp_path):
    a, b = tmp_path / "main" / "models", tmp_path / "shared" / "models"
    copy(templates, "bert", a, "x")
    copy(templates, "bert", b, "x")
    assert sources.local_model_names([a, b]) == ["main/models/x", "shared/models/x"]
    assert sources.local_folder("shared/models/x", [a, b]) == (b / "x").resolve()
    assert sources.looks_like_path("main/models/x", [a, b])


def test_a_model_folder_reached_through_a_link_keeps_its_short_name(templates, tmp_path):
    real = tmp_path / "disk" / "models"
    copy(templates, "bert", real, "x")
    linked = tmp_path / "srv" / "models"
    linked.parent.mkdir()
    linked.symlink_to(real)
    folder = sources.local_folder("models/x", [linked])
    assert folder == (real / "x").resolve()
    assert sources.display_name(folder, [linked]) == "models/x"


# ---- 5. the hub: timeouts, a deadline, a size cap; all faked ------------------------------------------------------


def hub_online(monkeypatch, tmp_path) -> None:
    """The hub switched on for one test, its cache and tformer's list of downloads in `tmp_path` (the functions
    that would reach it are replaced by the test: `fake_hub`)."""
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "tformer-cache"))  # the list of downloads
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


def into_hub_cache(repo_id: str, filename: str, source: Path) -> str:
    """`source` put into the hub cache's layout as huggingface_hub writes a download (a blob, a snapshot's link to
    it, the ref); returns the link's path, as hf_hub_download does."""
    repo = hub_disk.repo_folder(repo_id)
    blob, link = repo / "blobs" / filename, repo / "snapshots" / ("0" * 40) / filename
    blob.parent.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copy(source, blob)
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return str(link)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path, templates):
    """HfApi.model_info and hf_hub_download replaced; files are served from the tiny BERT template."""
    import huggingface_hub

    hub_online(monkeypatch, tmp_path)
    state = SimpleNamespace(sizes=None, params=None, calls=[], downloads=[], block=None)

    def model_info(self, repo_id, **kwargs):
        state.calls.append(kwargs)
        files = {p.name: p.stat().st_size for p in templates["bert"].iterdir()}
        files.update(state.sizes or {})
        siblings = [SimpleNamespace(rfilename=name, size=size) for name, size in files.items()]
        safetensors = SimpleNamespace(total=state.params) if state.params else None
        return SimpleNamespace(sha="0" * 40, siblings=siblings, safetensors=safetensors)

    def hf_hub_download(repo_id, filename, **kwargs):
        state.downloads.append((filename, kwargs))
        if state.block is not None:
            state.block.wait(60)
            raise TimeoutError("released")
        return into_hub_cache(repo_id, filename, templates["bert"] / filename)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return state


def test_hub_calls_carry_timeouts_and_the_model_loads(fake_hub):
    model = tc.load_model("someone/tiny-bert", device="cpu")
    assert model.config.d_model == 32
    assert fake_hub.calls[0]["timeout"] == sources.HUB_TIMEOUT_S
    assert fake_hub.downloads and all(k["etag_timeout"] == sources.HUB_TIMEOUT_S for _, k in fake_hub.downloads)


def test_a_download_larger_than_the_cap_is_refused_before_it_starts(fake_hub, monkeypatch):
    fake_hub.sizes = {"model.safetensors": 2_500_000_000}
    with pytest.raises(tc.CheckpointError) as caught:
        tc.load_model("someone/huge", device="cpu")
    message = str(caught.value)
    for piece in ("someone/huge", "2,500 MB", "2,000 MB", "TFORMER_HUB_MAX_MB"):
        assert piece in message, message
    assert not fake_hub.downloads
    fake_hub.sizes = None
    monkeypatch.setenv("TFORMER_HUB_MAX_MB", "0.01")  # 10 kB: less than the tiny model's weights
    with pytest.raises(tc.CheckpointError, match="the limit is 10 kB"):
        tc.load_model("someone/tiny", device="cpu")
    assert not fake_hub.downloads


def test_downloads_stay_within_the_disk_cap_least_recently_used_removed_first(fake_hub, monkeypatch, templates):
    """TFORMER_HUB_DISK_MB: room for two tiny models. A third download removes the least recently used one; a load
    from the cache counts as a use; a model larger than the whole cap is refused before it downloads."""
    one = sum(p.stat().st_size for p in templates["bert"].iterdir())
    monkeypatch.setenv("TFORMER_HUB_DISK_MB", str(2.5 * one / 1e6))
    for name in ("a", "b"):
        tc.load_model(f"someone/{name}", device="cpu")
    tc.load_model("someone/a", device="cpu")  # from the cache: "a" is now more recent than "b"
    tc.load_model("someone/c", device="cpu")
    assert hub_disk.repo_folder("someone/a").is_dir() and hub_disk.repo_folder("someone/c").is_dir()
    assert not hub_disk.repo_folder("someone/b").exists()
    kept = sum(hub_disk.folder_bytes(hub_disk.repo_folder(f"someone/{n}")) for n in "ac")
    assert one * 1.9 < kept <= 2.5 * one
    fake_hub.sizes = {"model.safetensors": int(3 * one)}
    downloads = len(fake_hub.downloads)
    with pytest.raises(tc.CheckpointError, match=r"someone/big: its files take .* TFORMER_HUB_DISK_MB"):
        tc.load_model("someone/big", device="cpu")
    assert len(fake_hub.downloads) == downloads and hub_disk.repo_folder("someone/a").is_dir()


def test_a_hub_model_with_too_many_parameters_is_refused_before_downloading(fake_hub):
    fake_hub.params = 7_000_000_000
    with pytest.raises(tc.CheckpointError, match=r"someone/big has 7 billion parameters.*TFORMER_MAX_PARAMS"):
        tc.load_model("someone/big", device="cpu")
    assert not fake_hub.downloads


def test_a_download_that_stalls_is_given_up_after_a_bounded_time(fake_hub, monkeypatch):
    """hf_hub_download never returns (a stalled transfer); load_model must answer anyway. The load runs in a
    thread; the test waits for it (the condition), with a generous limit only to report a hang."""
    monkeypatch.setattr(sources, "HUB_TIMEOUT_S", 0.05)
    fake_hub.block = threading.Event()
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            tc.load_model("someone/stalls", device="cpu")
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(120)
    fake_hub.block.set()
    assert not worker.is_alive(), "load_model kept waiting for a stalled download"
    assert isinstance(outcome[0], tc.CheckpointError), outcome[0]
    assert "did not finish within" in str(outcome[0]) and "someone/stalls" in str(outcome[0])
    assert len(fake_hub.downloads) == 1  # the worker was told to stop: no further file was started
