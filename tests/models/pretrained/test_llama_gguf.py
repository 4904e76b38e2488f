"""Llama.from_pretrained on a GGUF file that the test writes with gguf.GGUFWriter: the
model equals the one built from the same weights under Hugging Face names, and the file's
end token becomes generate's default."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import ConfigError, UserError
from qkv.models import Llama, LlamaConfig
from qkv.models.pretrained.gguf import read_gguf

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")

from tests.models.pretrained.test_gguf import CONFIG, hf_weights, write_llama_gguf  # noqa: E402


@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_a_gguf_file_loads_the_model_of_its_weights(tmp_path, untied):
    weights = hf_weights(seed=3, untied=untied)
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, weights)  # F32: the file holds these weights exactly
    ours = Llama.from_pretrained(path)
    config = LlamaConfig.from_hf(read_gguf(path).config)
    assert config.head_size == CONFIG["D"] and config.kv_heads == CONFIG["Hkv"]
    assert config.tie_embeddings is not untied
    tensors = {name: torch.from_numpy(w) for name, w in weights.items()}
    reference = Llama.from_weights(config, tensors)
    ids = torch.randint(0, CONFIG["V"], (2, 9))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, reference(ids).logits)
    assert ours.generation_defaults.eos_token_id == (1,)
    assert ours.generate(ids[:1], 3).shape[1] <= 12
    # the file's tensors became the weights (built on the meta device): none is left
    # there, each is held once, and tied embeddings are one tensor
    assert not any(p.is_meta for p in ours.parameters())
    assert (ours.lm_head.weight is ours.tok_emb.weight) is not untied
    assert all(p.is_contiguous() for p in ours.parameters())


def test_a_gguf_file_with_a_rope_scaling_qkv_does_not_read_is_named(tmp_path):
    path = tmp_path / "yarn.gguf"
    writer_add = gguf.GGUFWriter.add_rope_freq_base

    def with_yarn(self, value):  # the writer's own call, and one more key beside it
        writer_add(self, value)
        self.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        self.add_rope_scaling_factor(4.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_rope_freq_base", with_yarn)
        write_llama_gguf(path, hf_weights(seed=4))
    with pytest.raises(ConfigError, match="rope type 'yarn' is not supported") as err:
        Llama.from_pretrained(path)
    assert isinstance(err.value, UserError) and str(err.value).startswith(str(path))
