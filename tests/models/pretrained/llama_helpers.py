"""Helpers shared by the Llama tests: small random LLaMA, Mistral and Qwen2 folders that
transformers writes (nothing is downloaded), one per option that changes the computation."""

from __future__ import annotations

from pathlib import Path

VOCAB = 97
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.1,  # larger than 0.02: the next token depends on the context
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

# name -> (transformers config class, its options beyond _COMMON); sequences in the tests
# run to 20-30 tokens, beyond the dynamic context (16) and the sliding windows (5, 6)
CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(max_position_embeddings=64)),
    "llama-linear-bias-tied-mqa": (
        "LlamaConfig",
        dict(
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
            attention_bias=True,
            tie_word_embeddings=True,
            num_key_value_heads=1,
        ),
    ),
    "llama-dynamic-mlp-bias": (
        "LlamaConfig",
        dict(
            max_position_embeddings=16,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
            mlp_bias=True,
        ),
    ),
    "llama3-head-dim": (
        "LlamaConfig",
        dict(
            head_dim=24,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 10000.0,
            },
        ),
    ),
    "mistral-window": ("MistralConfig", dict(sliding_window=5, max_position_embeddings=64)),
    "qwen2-window-tied": (
        "Qwen2Config",
        dict(
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
            tie_word_embeddings=True,
            max_position_embeddings=64,
        ),
    ),
}

_MODELS = {
    "LlamaConfig": "LlamaForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
}


def hf_model(name: str):
    """A random transformers model of ``CONFIGS[name]`` (seeded by the caller)."""
    import transformers

    config_class, options = CONFIGS[name]
    config = getattr(transformers, config_class)(**{**_COMMON, **options})
    return getattr(transformers, _MODELS[config_class])(config)


def random_llama_folder(path: Path, name: str, **save) -> Path:
    """``save_pretrained`` of :func:`hf_model` into ``path`` (``save``: its options, e.g.
    ``max_shard_size``)."""
    hf_model(name).save_pretrained(path, **save)
    return path


def load_peer(folder: Path):
    """transformers' eager model of ``folder`` (eager: it returns attention weights)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    return model.eval()
