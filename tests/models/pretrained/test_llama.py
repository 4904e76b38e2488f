"""Llama against transformers' LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM
on small random models saved to disk (one per option that changes the computation):
logits and every layer's attention weights with left padding, with and without the cache,
greedy and beam generation; sharded folders; refusals in one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.models.pretrained.llama_helpers import (
    CONFIGS,
    VOCAB,
    hf_model,
    load_peer,
    random_llama_folder,
)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")

from qkv.errors import ConfigError, UserError  # noqa: E402
from qkv.models import Llama, LlamaConfig  # noqa: E402
from qkv.modules import DynamicRopeScaling  # noqa: E402

B, T = 3, 22  # longer than the dynamic context (16) and the sliding windows (5, 6)
PADS = [0, 4, 9]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    """(transformers' eager model, qkv's Llama) of one random folder of ``CONFIGS``."""
    torch.manual_seed(len(request.param))
    folder = random_llama_folder(tmp_path_factory.mktemp(request.param), request.param)
    return load_peer(folder), Llama.from_pretrained(folder)


def _left_padded(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, T) and a mask with PADS pads on the left."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (B, T), generator=gen)
    mask = torch.ones_like(ids)
    for row, n in enumerate(PADS):
        mask[row, :n] = 0
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face generate's rule: count real tokens; pads at 0."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _dynamic(model: Llama) -> bool:
    return isinstance(model.config.rope_scaling, DynamicRopeScaling)


def _weights_diff(ours: torch.Tensor, ref: torch.Tensor, real: torch.Tensor) -> float:
    """Largest difference of the attention weights of real query rows ``(B, H, Tq, Tk)``.

    transformers' sliding-window cache keeps only the latest keys: ``ref`` may have fewer
    key columns than ``ours``, whose extra (earliest) columns must then weigh nothing.
    """
    extra = ours.shape[-1] - ref.shape[-1]
    if extra:
        assert ours[..., :extra].abs().max() == 0
        ours = ours[..., extra:]
    return float((ours.transpose(1, 2)[real] - ref.transpose(1, 2)[real]).abs().max())


def test_logits_and_attentions_match_transformers(pair):
    peer, ours = pair
    ids, mask = _left_padded()
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, need_weights=True)
        ref = peer(ids, attention_mask=mask, position_ids=_positions(mask), output_attentions=True)
    real = mask.bool()
    assert out.logits.shape == (B, T, VOCAB)
    assert (out.logits - ref.logits)[real].abs().max() <= 1e-5
    assert len(out.attentions) == len(ref.attentions) == ours.config.num_layers
    for w, w_ref in zip(out.attentions, ref.attentions):
        assert w.shape == w_ref.shape == (B, 4, T, T)
        assert _weights_diff(w, w_ref, real) <= 1e-5
    # the rows are independent: the unpadded row alone gives the same logits
    with torch.no_grad():
        alone = ours(ids[:1]).logits
    assert (alone - out.logits[:1]).abs().max() <= 1e-5


def test_cached_decoding_matches_transformers_cache(pair):
    """Prefill 10 tokens, then one token at a time, each side with its own cache."""
    peer, ours = pair
    ids, mask = _left_padded(1)
    positions = _positions(mask)
    cache, peer_cache = ours.new_cache(), transformers.DynamicCache(config=peer.config)
    steps = [slice(0, 10)] + [slice(t, t + 1) for t in range(10, T)]
    with torch.no_grad():
        for step in steps:
            upto = mask[:, : step.stop]
            out = ours(ids[:, step], upto, cache=cache, need_weights=True)
            ref = peer(
                ids[:, step],
                attention_mask=upto,
                position_ids=positions[:, step],
                cache=peer_cache,
                use_cache=True,
                output_attentions=True,
            )
            real = mask[:, step].bool()
            assert (out.logits - ref.logits)[real].abs().max() <= 1e-5, step
            for w, w_ref in zip(out.attentions, ref.attentions):
                assert _weights_diff(w, w_ref, real) <= 1e-5, step
    assert cache.length == T


def test_cache_and_one_pass_agree(pair):
    """Without dynamic scaling (whose angles depend on the call's longest position, in
    transformers too), decoding with the cache gives the one-pass logits."""
    _, ours = pair
    if _dynamic(ours):
        pytest.skip("dynamic NTK angles depend on each call's positions (as in transformers)")
    ids, mask = _left_padded(2)
    cache = ours.new_cache()
    with torch.no_grad():
        whole = ours(ids, mask).logits
        parts = [ours(ids[:, :7], mask[:, :7], cache=cache).logits]
        parts += [
            ours(ids[:, t : t + 1], mask[:, : t + 1], cache=cache).logits for t in range(7, T)
        ]
    real = mask.bool()
    assert (torch.cat(parts, 1) - whole)[real].abs().max() <= 1e-5


def test_greedy_generation_matches_transformers(pair):
    peer, ours = pair
    ids, mask = _left_padded(3)
    with torch.no_grad():
        ref = peer.generate(
            ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0
        )
    out = ours.generate(ids, 12, attention_mask=mask)
    assert out.shape == (B, T + 12)
    assert torch.equal(out, ref), (out[:, T:] != ref[:, T:]).nonzero()[:5]
    if not _dynamic(ours):  # recomputing: same tokens (dynamic angles follow each call)
        assert torch.equal(ours.generate(ids, 12, attention_mask=mask, use_cache=False), out)


def test_beam_search_matches_transformers(pair):
    peer, ours = pair
    ids, mask = _left_padded(4)
    plain = ours.generate(ids, 8, attention_mask=mask)[:, T:]
    end = dict(eos_token_id=[int(plain[1, 2])], pad_token_id=3)
    options = dict(num_beams=3, num_return_sequences=2, length_penalty=1.5)
    with torch.no_grad():
        ref = peer.generate(
            ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **end, **options
        )
    out = ours.generate(ids, 8, attention_mask=mask, **end, **options)
    assert out.shape == ref.shape and torch.equal(out, ref)


def test_a_sharded_folder_loads_the_same_model(tmp_path):
    torch.manual_seed(5)
    model = hf_model("llama-dynamic-mlp-bias")
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "shards", max_shard_size="40KB")
    index = json.loads((tmp_path / "shards" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    one, shards = (
        Llama.from_pretrained(tmp_path / "one"),
        Llama.from_pretrained(tmp_path / "shards"),
    )
    for (name, a), (_, b) in zip(one.state_dict().items(), shards.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        assert (shards(ids).logits - model.eval()(ids).logits).abs().max() <= 1e-5


def test_from_hf_and_from_weights_build_the_folder_model(tmp_path):
    """The entry points of other formats: a config dict (no model_type: read as llama) and
    tensors under Hugging Face names."""
    safetensors = pytest.importorskip("safetensors.torch")
    torch.manual_seed(6)
    folder = random_llama_folder(tmp_path, "llama3-head-dim")
    raw = json.loads((folder / "config.json").read_text())
    del raw["model_type"]
    tensors = safetensors.load_file(folder / "model.safetensors")
    model = Llama.from_weights(LlamaConfig.from_hf(raw), tensors, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16 and not model.training
    reference = Llama.from_pretrained(folder, dtype=torch.bfloat16)
    ids = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def _folder_with(tmp_path, **changes):
    torch.manual_seed(7)
    folder = random_llama_folder(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_type="gpt_neox"), "model_type 'gpt_neox' is not a LLaMA-family decoder"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0}), "rope type 'yarn'"),
        (dict(rope_scaling={"type": "linear"}), "rope type 'linear' needs factor"),
        (dict(num_key_value_heads=3), "num_kv_heads 3 must divide num_heads 4"),
        (dict(hidden_act="tanh"), "hidden_act 'tanh'"),
        (dict(rms_norm_eps=-1.0), "rms_norm_eps must be a number > 0"),
    ],
    ids=["model-type", "rope-type", "rope-factor", "kv-heads", "activation", "eps"],
)
def test_a_config_qkv_cannot_read_is_refused_in_one_line(tmp_path, changes, message):
    folder = _folder_with(tmp_path, **changes)
    with pytest.raises(ConfigError, match=message) as err:
        Llama.from_pretrained(folder)
    assert isinstance(err.value, UserError)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(folder / "config.json"))


def test_untied_weights_without_an_output_projection_are_named(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    folder = _folder_with(tmp_path)
    tensors = safetensors.load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]
    config = LlamaConfig.from_hf(json.loads((folder / "config.json").read_text()))
    with pytest.raises(ValueError, match=r"missing \(1\): lm_head.weight"):
        Llama.from_weights(config, tensors)


_QWEN2 = dict(
    model_type="qwen2",
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=8,
    max_window_layers=2,
)


@pytest.mark.parametrize(
    "changes, window, full_layers",
    [
        (dict(use_sliding_window=True), 8, (0, 1)),
        (dict(use_sliding_window=False), None, ()),
        (
            dict(use_sliding_window=True, layer_types=["sliding_attention", "full_attention"] * 2),
            8,
            (1, 3),
        ),
    ],
    ids=["max-window-layers", "window-off", "layer-types"],
)
def test_qwen2_windows_are_read_as_transformers_reads_them(changes, window, full_layers):
    config = LlamaConfig.from_hf({**_QWEN2, **changes})
    assert (config.sliding_window, config.full_layers) == (window, full_layers)
    assert config.qkv_bias and not config.out_bias and not config.mlp_bias
    peer = transformers.Qwen2Config(
        **{k: v for k, v in {**_QWEN2, **changes}.items() if k != "model_type"}
    )
    windows = [config.window(i) for i in range(4)]
    assert windows == [window if t == "sliding_attention" else None for t in peer.layer_types]


def test_older_config_keys_rope_scaling_and_rope_theta_are_read():
    raw = {**_QWEN2, "model_type": "llama", "rope_theta": 500000.0}
    raw["rope_scaling"] = {"type": "linear", "factor": 4.0}
    config = LlamaConfig.from_hf(raw)
    assert config.rope_base == 500000.0 and config.rope_scaling.factor == 4.0
    assert config.sliding_window is None  # llama has no window, whatever the file says
