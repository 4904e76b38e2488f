"""The tokenizer and chat template of a GGUF file: the SmolLM2 file's ids equal transformers'
tokenizer loaded from the same file; its chat template renders as transformers renders it."""

from __future__ import annotations

import pytest

from qkv.errors import ModelFileError
from qkv.models import load_tokenizer
from qkv.models.pretrained.gguf import load_gguf_tokenizer, read_gguf_metadata, smollm2_path
from qkv.models.pretrained.gguf_tokenizer import (
    chat_template_of,
    render_chat,
    special_tokens_of,
    tokenizer_from_gguf,
)

pytest.importorskip("gguf", reason="needs the gguf package: pip install 'qkv[llm]'")

TEXTS = {
    "english": "The attention of a Transformer weighs every earlier token; it's 42% faster!",
    "korean": "안녕하세요, 트랜스포머의 어텐션은 모든 토큰을 봅니다. 한국어 문장입니다.",
    "code": "def attend(q, k, v):\n    w = (q @ k.T).softmax(-1)\t# (T, T)\n    return w @ v\n",
    "special": "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|><repo_name>qkv<file_sep>",
    "spaces": "  two leading spaces,\n\n\ttabs and trailing   ",
    "mixed": "emoji 🤗, numbers 1234567.89, accents éàü, CJK 注意力",
}


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = smollm2_path()
    except ModelFileError as err:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({err})")
    return path, read_gguf_metadata(path)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2):
    transformers = pytest.importorskip("transformers", reason="needs transformers (qkv[parity])")
    path, _ = smollm2
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("kind", list(TEXTS))
def test_ids_equal_transformers_from_the_same_file(smollm2, hf_tokenizer, kind):
    _, meta = smollm2
    ours = tokenizer_from_gguf(meta).encode(TEXTS[kind])
    theirs = hf_tokenizer(TEXTS[kind])["input_ids"]
    assert ours.ids == theirs
    assert tokenizer_from_gguf(meta).decode(ours.ids, skip_special_tokens=False) == TEXTS[kind]


def test_special_tokens_stay_whole(smollm2):
    _, meta = smollm2
    ids = tokenizer_from_gguf(meta).encode("<|im_start|>assistant<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|>, <|im_end|>
    assert special_tokens_of(meta) == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }


def test_chat_template_renders_as_transformers(smollm2, hf_tokenizer):
    _, meta = smollm2
    template = chat_template_of(meta)
    assert template and "<|im_start|>" in template
    messages = [{"role": "user", "content": "What is attention? 한 문장으로."}]
    ours = render_chat(template, messages, True, **special_tokens_of(meta))
    theirs = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours == theirs and ours.endswith("<|im_start|>assistant\n")


def test_load_gguf_tokenizer_pads_batches(smollm2):
    path, _ = smollm2
    tok = load_gguf_tokenizer(path, max_length=5)
    short, long = tok.encode_batch(["Hi", "a longer sentence than the first one"])
    assert len(short.ids) == len(long.ids) == 5
    assert short.ids[-1] == 2 and short.attention_mask[-1] == 0  # padded with <|im_end|>


def test_sentencepiece_vocabularies_are_refused_by_name():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "▁a"]}
    with pytest.raises(ModelFileError, match="'llama'"):
        tokenizer_from_gguf(meta, source="m.gguf")


def test_a_template_that_raises_is_one_line():
    template = "{{ raise_exception('only user and assistant roles') }}"
    with pytest.raises(ModelFileError, match="only user and assistant roles"):
        render_chat(template, [{"role": "system", "content": "x"}])


def test_load_tokenizer_reads_a_gguf_file(smollm2):
    """qkv.models.load_tokenizer took only Hugging Face folders; a GGUF file gives the
    tokenizer its metadata describes, the same ids as load_gguf_tokenizer."""
    path, _ = smollm2
    text = "The cat sat on the mat. 고양이가 잤다."
    ids = load_tokenizer(path).encode(text).ids
    assert ids == load_gguf_tokenizer(path).encode(text).ids and len(ids) > 5
