"""qkv.models.pretrained.gguf on small GGUF files that the tests write with gguf.GGUFWriter:
every weight type round-trips against the gguf package's dequantisation, the Q/K rows get
Hugging Face's order back, and damaged files give one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.data.tokenizers import bytes_to_unicode
from qkv.errors import ModelFileError, UserError
from qkv.models.pretrained.gguf import (
    SUPPORTED_TYPES,
    hf_name,
    load_gguf_tokenizer,
    read_gguf,
    read_gguf_metadata,
    unpermute_rows,
)

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")

# a config whose rows are multiples of 256 (the K-quants' block)
CONFIG = dict(E=256, I=512, H=4, Hkv=2, D=64, layers=2, V=300)
QUANTISED = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1")  # those gguf.quants.quantize writes
RANDOM_BLOCKS = ("Q4_K", "Q5_K", "Q6_K")  # blocks of random bytes with finite scales
# (offset, count) of the float16 scales inside each K-quant block
K_SCALES = {"Q4_K": [(0, 2)], "Q5_K": [(0, 2)], "Q6_K": [(208, 1)]}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py ``permute`` of the Q and K rows (to pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_weights(seed: int = 0, untied: bool = False) -> dict[str, np.ndarray]:
    """Random weights of a small LlamaForCausalLM, Hugging Face names and row order."""
    c, rng = CONFIG, np.random.default_rng(seed)
    E, I, V, HD, KD = c["E"], c["I"], c["V"], c["H"] * c["D"], c["Hkv"] * c["D"]
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if untied:
        shapes["lm_head.weight"] = (V, E)
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (HD, E),
            p + "self_attn.k_proj.weight": (KD, E),
            p + "self_attn.v_proj.weight": (KD, E),
            p + "self_attn.o_proj.weight": (E, HD),
            p + "post_attention_layernorm.weight": (E,),
            p + "mlp.gate_proj.weight": (I, E),
            p + "mlp.up_proj.weight": (I, E),
            p + "mlp.down_proj.weight": (E, I),
        }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, i, *module, suffix = name.split(".")
    return f"blk.{i}.{GGUF_NAMES['.'.join(module)]}.{suffix}"


def random_blocks(rows: int, cols: int, qtype: str, rng) -> np.ndarray:
    """Raw K-quant blocks: random bytes, with each block's float16 scales set to small
    finite values (random bits would make infinities and NaNs)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset, count in K_SCALES[qtype]:
        scales = rng.uniform(0.001, 0.05, (rows, cols // block, count)).astype(np.float16)
        raw[:, :, offset : offset + 2 * count] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def write_llama_gguf(
    path: Path,
    weights: dict[str, np.ndarray],
    qtype: str = "F32",
    arch: str = "llama",
    ffn: int | None = None,
    rng=None,
    chat_template: str | None = None,
) -> dict[str, np.ndarray]:
    """Write ``weights`` (Hugging Face order) as llama.cpp does: Q and K rows permuted,
    matrices in ``qtype``, vectors in F32, a tiny byte-level vocabulary.

    Returns:
        the weights as the file holds them after dequantisation, in GGUF row order.
    """
    c, rng = CONFIG, rng or np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["layers"])
    w.add_context_length(64)
    w.add_embedding_length(c["E"])
    w.add_feed_forward_length(ffn or c["I"])
    w.add_head_count(c["H"])
    w.add_head_count_kv(c["Hkv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(c["D"])
    w.add_vocab_size(c["V"])
    spelled = list(bytes_to_unicode().values())  # GPT-2's one character per byte
    tokens = ["<s>", "</s>", *spelled, "to", "tok", *(f"tok{i}" for i in range(c["V"] - 260))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_token_merges(["t o", "to k"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    stored = {}
    for name, value in weights.items():
        if ".q_proj." in name:
            value = llama_cpp_permute(value, c["H"])
        elif ".k_proj." in name:
            value = llama_cpp_permute(value, c["Hkv"])
        kind = gguf.GGMLQuantizationType[qtype if value.ndim == 2 else "F32"]
        if kind.name == "F32":
            data = value
        elif kind.name in RANDOM_BLOCKS:
            data = random_blocks(*value.shape, kind.name, rng)
        else:
            data = gguf.quants.quantize(value, kind)
        w.add_tensor(gguf_name(name), data, raw_dtype=kind)
        stored[name] = gguf.quants.dequantize(data, kind).reshape(value.shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, UserError)
    return message


# -- names, order, types -------------------------------------------------------------------


def test_hf_names_of_llama_cpp_tensors():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.17.attn_k.weight") == "model.layers.17.self_attn.k_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None and hf_name("blk.x.attn_q.weight") is None


@pytest.mark.parametrize("heads,rows,cols", [(9, 576, 5), (3, 192, 7), (4, 256, 0)])
def test_unpermute_inverts_llama_cpp_permute(heads, rows, cols):
    w = np.random.default_rng(heads).standard_normal((rows, cols) if cols else (rows,))
    back = unpermute_rows(torch.from_numpy(llama_cpp_permute(w, heads)), heads)
    torch.testing.assert_close(back, torch.from_numpy(w), rtol=0, atol=0)
    assert not np.array_equal(llama_cpp_permute(w, heads), w)  # it does reorder


def test_unpermute_matches_transformers_reverse_permute():
    utils = pytest.importorskip(
        "transformers.modeling_gguf_pytorch_utils", reason="transformers' GGUF loader absent"
    )
    if not hasattr(utils, "LlamaTensorProcessor"):
        pytest.skip("this transformers has no LlamaTensorProcessor")
    w = np.random.default_rng(0).standard_normal((192, 11))
    theirs = utils.LlamaTensorProcessor()._reverse_permute_weights(w, 9, 3)
    ours = unpermute_rows(torch.from_numpy(w), 3).numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
def test_every_type_round_trips_against_gguf_dequantisation(tmp_path, qtype):
    weights = hf_weights(untied=True)
    stored = write_llama_gguf(tmp_path / "m.gguf", weights, qtype)
    model = read_gguf(tmp_path / "m.gguf")
    assert set(model.tensors) == set(weights)
    c = CONFIG
    for name, value in model.tensors.items():
        assert value.dtype == torch.float32 and value.shape == weights[name].shape, name
        # the file's rows are llama.cpp's order: permuting ours must give them back exactly
        heads = c["H"] if ".q_proj." in name else c["Hkv"] if ".k_proj." in name else None
        ours = value.numpy() if heads is None else llama_cpp_permute(value.numpy(), heads)
        np.testing.assert_array_equal(ours, stored[name], err_msg=name)
    if qtype in ("F32", *QUANTISED):  # and the weights are the ones written, to the type's step
        tol = {"F32": 0, "F16": 2e-3, "BF16": 2e-2, "Q8_0": 0.03, "Q4_0": 0.6, "Q4_1": 0.4}
        for name, value in model.tensors.items():
            err = np.abs(value.numpy().astype(np.float64) - weights[name]).max()
            assert err <= tol[qtype] * np.abs(weights[name]).max(), (name, err)


def test_bfloat16_weights_and_config(tmp_path):
    write_llama_gguf(tmp_path / "m.gguf", hf_weights(), "Q8_0")
    model = read_gguf(tmp_path / "m.gguf", dtype=torch.bfloat16)
    ref = read_gguf(tmp_path / "m.gguf")
    for name, value in model.tensors.items():
        assert value.dtype == torch.bfloat16
        torch.testing.assert_close(value, ref.tensors[name].to(torch.bfloat16), rtol=0, atol=0)
    c = CONFIG
    assert model.config | {"rms_norm_eps": 1e-5} == {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": c["V"],
        "hidden_size": c["E"],
        "intermediate_size": c["I"],
        "num_hidden_layers": c["layers"],
        "num_attention_heads": c["H"],
        "num_key_value_heads": c["Hkv"],
        "head_dim": c["D"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    assert abs(model.config["rms_norm_eps"] - 1e-5) < 1e-12
    assert "lm_head.weight" not in model.tensors and model.chat_template is None
    meta = read_gguf_metadata(tmp_path / "m.gguf")
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == c["layers"]
    tok = load_gguf_tokenizer(tmp_path / "m.gguf")
    assert tok.encode("a token").tokens == ["a", "Ġ", "tok", "e", "n"]
    assert model.tokenizer.encode("<s>to").ids == [0, 258]
    assert model.tokenizer.encode("é!").ids == [2 + 0xC3, 2 + 0xA9, 2 + ord("!")]


# -- files that cannot be read: one line each ------------------------------------------------


def test_wrong_magic(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights())
    path.write_bytes(b"GGML" + path.read_bytes()[4:])
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "not a GGUF file" in one_line(err)


def test_truncated_tensor(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights())
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "truncated" in one_line(err) and "blk.1.ffn_down.weight" in str(err.value)


@pytest.mark.parametrize("field,value", [("tensor", 2**40), ("kv", 2**62)])
def test_counts_beyond_the_file_fail_at_once(tmp_path, field, value):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights())
    data = bytearray(path.read_bytes())
    at = 8 if field == "tensor" else 16  # magic, version, tensor count, kv count
    data[at : at + 8] = value.to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "claims" in one_line(err)


def test_a_string_longer_than_the_file(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights())
    data = bytearray(path.read_bytes())
    data[24:32] = (2**50).to_bytes(8, "little")  # the first key's length
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "claims" in one_line(err)


def test_shape_that_does_not_match_the_config(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights(), ffn=384)
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    message = one_line(err)
    assert "blk.0.ffn_down.weight" in message or "blk.0.ffn_gate.weight" in message
    assert "(384, 256)" in message or "(256, 384)" in message


def test_another_architecture_is_refused_by_name(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights(), arch="gpt2")
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "'gpt2'" in one_line(err)


def test_a_type_qkv_does_not_dequantise_is_named(tmp_path):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, hf_weights(), qtype="Q5_0")
    with pytest.raises(ModelFileError) as err:
        read_gguf(path)
    assert "Q5_0" in one_line(err)


def test_a_file_that_is_not_there(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "missing.gguf")
