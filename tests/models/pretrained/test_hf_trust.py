"""Hostile Hugging Face folders: a config.json whose sizes its weights do not back, JSON made
to crash a parser, a header that names gigabytes. Each is refused in one line naming the
file and the key before anything of the claimed size is allocated; a tensor the model does
not use is never read."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from qkv.errors import ModelFileError
from tests.models.memory_helpers import GIB, MAX_RSS, run_bounded, write_safetensors
from tests.models.pretrained.folder_helpers import copy_folder, random_bert_folder, refused
from tests.models.pretrained.gpt_helpers import random_gpt2_folder
from tests.models.pretrained.llama_helpers import random_llama_folder

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from qkv.models import GPT, BertModel, Llama, ViT, load_tokenizer  # noqa: E402
from qkv.models.pretrained.hf import load_state_dict  # noqa: E402

VOCAB = 90
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi"] + [f"w{i}" for i in range(84)]


def _with_tokenizer(folder):
    """``folder`` with a WordPiece ``tokenizer.json`` of :data:`WORDS` (as ``qkv show``
    needs one), its ``tokenizer_config.json`` and ``special_tokens_map.json``."""
    model = tokenizers.models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "[PAD]"}))
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return _with_tokenizer(random_bert_folder(tmp_path_factory.mktemp("bert"), VOCAB))


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    random_gpt2_folder(path, layers=2, heads=2, dim=16, vocab=VOCAB, positions=32)
    return _with_tokenizer(path)


def _refused(load, folder, *pieces: str) -> str:
    """The one-line ModelFileError of ``load(folder)``, short, holding every piece."""
    message = refused(load, folder, *pieces, error=ModelFileError)
    assert len(message) < 500, message
    return message


SIZES = [  # (model, config.json key, claimed value, what the message says of the weights)
    ("bert", "num_hidden_layers", 100_000, "does not match the 2 layer(s) of weights in "),
    ("bert", "hidden_size", 49152, "'embeddings.word_embeddings.weight' is (90, 16) there, "),
    ("bert", "intermediate_size", 1_000_000, "intermediate.dense.weight' is (24, 16) there, "),
    ("bert", "vocab_size", 10_000_000, "'embeddings.word_embeddings.weight' is (90, 16) there"),
    ("bert", "max_position_embeddings", 10**7, "position_embeddings.weight' is (32, 16) there"),
    ("gpt", "n_layer", 100_000, "does not match the 2 layer(s) of weights in "),
    ("gpt", "n_embd", 49152, "'transformer.wte.weight' is (90, 16) there, (90, 49152) by"),
    ("gpt", "n_positions", 10**7, "'transformer.wpe.weight' is (32, 16) there, (10000000, 16)"),
    ("gpt", "n_inner", 1_000_000, "(from 'transformer.h.0.mlp.c_fc.weight') is (64, 16) there"),
    ("gpt", "vocab_size", 10**7, "'transformer.wte.weight' is (90, 16) there, (10000000, 16)"),
]


@pytest.mark.parametrize("kind, key, value, weights", SIZES, ids=lambda x: str(x)[:10])
def test_config_sizes_the_weights_do_not_back_are_refused_before_building(
    bert_folder, gpt_folder, tmp_path, kind, key, value, weights
):
    """100,000 layers grew past 6 GB, hidden_size 49152 asked for 9.7 GB, before the
    weights were compared with the model; now the headers are compared first."""
    folder = copy_folder(
        bert_folder if kind == "bert" else gpt_folder, tmp_path / "m", **{key: value}
    )
    load = BertModel.from_pretrained if kind == "bert" else GPT.from_pretrained
    message = _refused(load, folder, f"{folder / 'config.json'}: {key} {value} ", weights)
    assert "model.safetensors" in message


def test_sharded_and_pytorch_bin_folders_are_checked_from_their_headers(gpt_folder, tmp_path):
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt_folder)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="4KB")
    (tmp_path / "bin").mkdir()
    shutil.copy(gpt_folder / "config.json", tmp_path / "bin")
    torch.save(load_state_dict(gpt_folder), tmp_path / "bin" / "pytorch_model.bin")
    ids = torch.randint(0, VOCAB, (2, 7))
    want = GPT.from_pretrained(gpt_folder)(ids).logits
    for name, file in (("sharded", "model.safetensors.index.json"), ("bin", "pytorch_model.bin")):
        assert torch.equal(GPT.from_pretrained(tmp_path / name)(ids).logits, want)
        for key, value, piece in (("n_layer", 100_000, "2 layer(s)"), ("n_embd", 49152, "(90,")):
            folder = copy_folder(tmp_path / name, tmp_path / f"{name}-{key}", **{key: value})
            _refused(GPT.from_pretrained, folder, f"{key} {value} ", f"in {file}", piece)


def test_a_tensor_the_model_does_not_use_is_never_read(bert_folder, tmp_path):
    """A task head's 1 TiB tensor beside the encoder (a sparse hole in the file), more than
    any memory here: the whole file was read (safetensors' load_file) and the allocation
    failed; now only the encoder's tensors are read, and the model loads."""
    folder = tmp_path / "head"
    folder.mkdir()
    shutil.copy(bert_folder / "config.json", folder)
    state = {f"bert.{n}": t for n, t in load_state_dict(bert_folder).items()}
    holes = {"cls.predictions.decoder.weight": ((2**38,), torch.float32)}  # 1 TiB
    write_safetensors(folder / "model.safetensors", state, holes=holes)
    assert (folder / "model.safetensors").stat().st_size > 1024 * GIB
    ids = torch.randint(0, VOCAB, (2, 9))
    got = BertModel.from_pretrained(folder)(ids).last_hidden_state
    assert torch.equal(got, BertModel.from_pretrained(bert_folder)(ids).last_hidden_state)


def test_weights_that_do_not_fit_in_memory_are_refused_by_their_key(bert_folder, tmp_path):
    """A config and header that agree on a 64 GiB embedding (a sparse hole): refused by the
    memory available before anything is allocated."""
    folder = tmp_path / "big"
    folder.mkdir()
    rows = 2**30
    config = json.loads((bert_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": rows}))
    state = load_state_dict(bert_folder)
    del state["embeddings.word_embeddings.weight"]
    holes = {"embeddings.word_embeddings.weight": ((rows, 16), torch.float32)}
    write_safetensors(folder / "model.safetensors", state, holes=holes)
    _refused(
        BertModel.from_pretrained,
        folder,
        f"{folder / 'config.json'}: the model needs about ",
        "of memory, more than the ",
        f"embeddings.word.weight alone is ({rows}, 16) (vocab_size {rows})",
    )


NESTED = "[" * 100_000 + "]" * 100_000
DIGITS = "7" * 5000
POISONS = {  # the poison -> what the message says of it
    NESTED: "not JSON that qkv reads: nested 100001 levels deep",  # was a RecursionError
    DIGITS: "not JSON that qkv reads: an integer of 5,000 digits",  # a ValueError traceback
}


def _poison(file, poison: str) -> None:
    """Add the key ``"x": poison`` to the JSON object in ``file``."""
    text = file.read_text().rstrip()
    assert text.endswith("}")
    file.write_text(text[:-1] + f', "x": {poison}}}')


@pytest.mark.parametrize("poison", list(POISONS), ids=["nested", "digits"])
@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "model.safetensors.index.json",
    ],
)
def test_hostile_json_in_any_file_of_a_folder_is_one_line_naming_it(
    gpt_folder, tmp_path, name, poison
):
    folder = tmp_path / "m"
    if name == "model.safetensors.index.json":
        model = transformers.GPT2LMHeadModel.from_pretrained(gpt_folder)
        model.save_pretrained(folder, max_shard_size="4KB")
        for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(gpt_folder / file, folder)
    else:
        shutil.copytree(gpt_folder, folder)
    _poison(folder / name, poison)

    def load(path):
        load_tokenizer(path)
        GPT.from_pretrained(path)

    _refused(load, folder, f"{folder / name}: {POISONS[poison]}")


def test_qkv_show_refuses_a_config_its_weights_do_not_back_in_one_line(bert_folder, tmp_path):
    """``qkv show --model DIR`` on num_hidden_layers 100000: 61 s, 1.6 GiB under a 2 GiB
    address space and a traceback; now exit 2 and one line, well under 1 GiB."""
    folder = copy_folder(bert_folder, tmp_path / "m", num_hidden_layers=100_000)
    out = tmp_path / "page.html"
    run = run_bounded(["-m", "qkv", "show", "--model", str(folder), "hi", "--out", str(out)])
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-3000:]
    assert run.stderr.startswith("qkv show: error: ") and "Traceback" not in run.stderr
    assert f"{folder / 'config.json'}: num_hidden_layers 100000 does not match" in run.stderr
    assert run.max_rss < MAX_RSS and not out.exists(), run.max_rss


@pytest.mark.parametrize(
    "key, value, piece",
    [
        ("num_hidden_layers", 100_000, "does not match the 3 layer(s) of weights"),
        ("hidden_size", 49152, "there, "),
        ("intermediate_size", 1_000_000, "there"),
    ],
)
def test_a_llama_config_the_weights_do_not_back_is_refused_before_building(
    tmp_path, key, value, piece
):
    """Llama.from_pretrained built the model the config described before comparing the
    weights (100,000 layers were built first); it loads through the same header checks."""
    torch.manual_seed(0)
    folder = random_llama_folder(tmp_path / "llama", "llama")
    folder = copy_folder(folder, tmp_path / "m", **{key: value})
    message = _refused(Llama.from_pretrained, folder, f"{folder / 'config.json'}: {key} {value}")
    assert piece in message and "model.safetensors" in message


def test_a_vit_config_the_weights_do_not_back_is_refused_before_building(tmp_path):
    """ViT.from_pretrained read every stored tensor before comparing the config with
    them (a 1 TiB tensor the model drops failed the allocation); it loads through the
    same header checks: sizes are refused by their key before anything is built, and
    only the tensors the model uses are read."""
    config = transformers.ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
    )
    transformers.ViTModel(config).save_pretrained(tmp_path / "vit")
    pixels = torch.randn(2, 1, 8, 8)
    want = transformers.ViTModel.from_pretrained(tmp_path / "vit").eval()(pixels)
    got = ViT.from_pretrained(tmp_path / "vit")(pixels)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
    folder = copy_folder(tmp_path / "vit", tmp_path / "m", num_hidden_layers=100_000)
    refused(ViT.from_pretrained, folder, "num_hidden_layers = 100000", "hold 2 layers")
    # a 1 TiB masked-image-modelling token (a sparse hole) that the model drops: not read
    state = load_state_dict(tmp_path / "vit")
    (tmp_path / "hole").mkdir()
    shutil.copy(tmp_path / "vit" / "config.json", tmp_path / "hole")
    holes = {"embeddings.mask_token": ((2**38,), torch.float32)}
    write_safetensors(tmp_path / "hole" / "model.safetensors", state, holes=holes)
    got = ViT.from_pretrained(tmp_path / "hole")(pixels)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
