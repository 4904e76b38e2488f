"""BPE, character and word tokenizers: exact round trips, special ids, JSON storage."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data.corpus import read_lines
from qkv.data.tokenizers import (
    SPECIAL_TOKENS,
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    bytes_to_unicode,
    tokenizer_from_json,
    train_tokenizers,
)
from qkv.data.toy import make_splits

pytest.importorskip("tokenizers", reason="BPE needs the hf extra (pip install 'qkv[hf]')")

TOY = make_splits(400, 0, 0, seed=5, min_len=2, max_len=12)["train"]
TOY_TEXT = [p.ko for p in TOY] + [p.en for p in TOY]


@pytest.fixture(scope="module")
def corpus_lines(shared_data):
    """German, English and Korean training sentences from the shared corpora."""
    m30k, tatoeba = shared_data / "multi30k", shared_data / "ko-en" / "tatoeba"
    return {
        "de": read_lines(m30k / "train.de")[:3000],
        "en": read_lines(m30k / "train.en")[:3000],
        "ko": read_lines(tatoeba / "kor-eng.ko"),
    }


@pytest.fixture(scope="module")
def bpe(corpus_lines):
    texts = corpus_lines["de"] + corpus_lines["en"] + corpus_lines["ko"]
    return BPETokenizer.train(texts, vocab_size=4000)


@pytest.fixture(scope="module")
def toy_bpe():
    return BPETokenizer.train(TOY_TEXT, vocab_size=500)


def test_special_ids_are_shared(toy_bpe):
    for tok in (toy_bpe, CharTokenizer.train(TOY_TEXT), WordTokenizer.train(TOY_TEXT)):
        assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
        assert [tok.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
        ids = tok.encode(TOY[0].en)
        assert all(i >= 4 for i in ids)  # no <s>/</s> added, nothing unknown
        assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]) == TOY[0].en


@pytest.mark.parametrize("kind", ["bpe", "char", "word"])
def test_toy_round_trip_and_json(kind):
    src, tgt = train_tokenizers(
        kind, [p.ko for p in TOY], [p.en for p in TOY], vocab_size=600, joint=False
    )
    for tok, texts in ((src, [p.ko for p in TOY]), (tgt, [p.en for p in TOY])):
        restored = tokenizer_from_json(tok.to_json())
        assert type(restored) is type(tok) and restored.vocab_size == tok.vocab_size
        for text in texts[:100]:
            ids = tok.encode(text)
            assert tok.decode(ids) == text
            assert restored.encode(text) == ids
    assert src.vocab_size != tgt.vocab_size or src.to_json() != tgt.to_json()


def test_joint_vocabulary_is_one_tokenizer():
    src, tgt = train_tokenizers("bpe", [p.ko for p in TOY], [p.en for p in TOY], vocab_size=500)
    assert src is tgt
    assert src.encode(TOY[0].ko) and all(i != src.unk_id for i in src.encode(TOY[0].en))


def test_bpe_merges_shorten_text(toy_bpe):
    tokens = sum(len(ids) for ids in toy_bpe.encode_batch(TOY_TEXT))
    assert tokens < 0.7 * sum(len(text) for text in TOY_TEXT)


def test_unknown_characters_and_literal_special_tokens(toy_bpe):
    char = CharTokenizer.train(["ab"])
    assert char.encode("aXb") == [char.encode("a")[0], char.unk_id, char.encode("b")[0]]
    word = WordTokenizer.train(["the cat"], min_freq=1)
    assert word.encode("the dog") == [word.encode("the")[0], word.unk_id]
    # "<s>" typed in text is text, not the start-of-sequence id
    assert toy_bpe.bos_id not in toy_bpe.encode("the <s> cat")


def test_vocabulary_limits():
    word = WordTokenizer.train(["a a a b b c"], max_size=6)
    assert word.vocab_size == 6 and word.id_to_token(4) == "a" and word.id_to_token(5) == "b"
    assert WordTokenizer.train(["a a b"], min_freq=2).vocab_size == 5


def test_json_is_plain_and_checked(toy_bpe):
    data = json.loads(toy_bpe.to_json())
    assert data["type"] == "bpe" and data["version"] == 1
    assert isinstance(BPETokenizer.from_json(toy_bpe.to_json()), BPETokenizer)
    with pytest.raises(ValueError, match="not 'char'"):
        CharTokenizer.from_json(toy_bpe.to_json())
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_json('{"type": "sentencepiece", "version": 1}')
    with pytest.raises(ValueError, match="not a qkv tokenizer"):
        tokenizer_from_json("[1, 2]")


@pytest.mark.parametrize("lang", ["de", "en", "ko"])
def test_corpus_sentences_round_trip(bpe, corpus_lines, lang):
    lines = corpus_lines[lang][:1000]
    for line, ids in zip(lines, bpe.encode_batch(lines)):
        assert bpe.decode(ids) == line
    restored = tokenizer_from_json(bpe.to_json())
    assert restored.encode_batch(lines[:50]) == bpe.encode_batch(lines[:50])


@pytest.fixture(scope="module")
def alphabet(corpus_lines):
    chars = set()
    for lines in corpus_lines.values():
        for line in lines:
            chars.update(line)
    return sorted(chars - {" ", "\t"})


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_bpe_round_trips_text_from_the_corpus_alphabet(bpe, alphabet, data):
    word = st.text(st.sampled_from(alphabet), min_size=1, max_size=12)
    words = data.draw(st.lists(word, min_size=1, max_size=8))
    separators = data.draw(
        st.lists(st.sampled_from([" ", "  "]), min_size=len(words) - 1, max_size=len(words) - 1)
    )
    text = words[0] + "".join(sep + w for sep, w in zip(separators, words[1:]))
    assert bpe.decode(bpe.encode(text)) == text
    char = CharTokenizer.train([text])
    assert char.decode(char.encode(text)) == text


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_special_token_strings_in_text_are_unknown_words(data):
    """A word "<pad>", "<s>" or "</s>" typed in text is an unknown word, never a special id.

    Mapped to the pad id it broke the source mask of every model (a pad inside the
    sentence: the RNN encoder refused it); to ``</s>`` it ended a training target early.
    """
    vocab = data.draw(
        st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=6, unique=True)
    )
    word = WordTokenizer.train([" ".join(vocab)])
    words = data.draw(st.lists(st.sampled_from(vocab + list(SPECIAL_TOKENS)), min_size=1))
    ids = word.encode(" ".join(words))
    assert len(ids) == len(words)
    for w, i in zip(words, ids):
        if w in SPECIAL_TOKENS:
            assert i == word.unk_id
        else:
            assert i >= len(SPECIAL_TOKENS) and word.id_to_token(i) == w


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_special_token_strings_in_training_text_are_not_vocabulary(special):
    """Corpora such as Penn Treebank write "<unk>" as a word: training the word vocabulary
    on them raised "vocabulary has duplicate tokens" (a traceback from ``qkv train``)."""
    word = WordTokenizer.train([f"the {special} cat", f"{special} {special} sat"])
    assert word.vocab_size == len(SPECIAL_TOKENS) + 3
    assert word.encode(f"the {special}") == [word.encode("the")[0], word.unk_id]
    assert WordTokenizer.train([special], max_size=5).vocab_size == len(SPECIAL_TOKENS)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(st.characters(blacklist_characters=" ", codec="utf-8"), min_size=1),
        min_size=1,
        max_size=8,
    )
)
def test_word_tokenizer_round_trips_any_words_between_single_spaces(words):
    """Words may hold no-break spaces (Multi30k's "Nummer\\u00a028"), tabs or other Unicode
    spaces: str.split() cut them there, and decoding joined the pieces with a plain space."""
    text = " ".join(words)
    word = WordTokenizer.train([text])
    assert word.decode(word.encode(text)) == text
    assert len(word.encode(text)) == len(words)


def test_word_tokenizer_keeps_no_break_spaces_in_multi30k(shared_data):
    train = read_lines(shared_data / "multi30k" / "train.de")
    lines = [line for line in train if "\u00a0" in line] + ["2\u202fFinger"]
    assert len(lines) > 10
    word = WordTokenizer.train(lines)
    assert [word.decode(word.encode(line)) for line in lines] == lines


@pytest.mark.parametrize("kind", ["bpe", "char", "word"])
def test_decode_takes_a_tensor_row_and_refuses_ids_outside_the_vocabulary(kind):
    """decode(batch.tgt_out[0]) wrote "<s>", "</s>" and "<pad>" as text (char, word): a
    tensor's elements hash by identity, so they were never found among the special ids.
    An id past the vocabulary was an IndexError (char, word) or silently nothing (BPE), and
    -1 silently the last token."""
    import torch

    src, _ = train_tokenizers(kind, [p.en for p in TOY], [p.en for p in TOY], vocab_size=300)
    ids = src.encode(TOY[1].en)
    row = torch.tensor([src.bos_id, *ids, src.eos_id, src.pad_id, src.pad_id])
    assert src.decode(row) == src.decode(row.numpy()) == TOY[1].en
    for bad in (src.vocab_size, -1):
        with pytest.raises(ValueError, match=rf"id {bad} is outside the vocabulary \(0\.\."):
            src.decode([*ids, bad])
    with pytest.raises(TypeError, match="one row at a time"):
        src.decode(row[None].expand(2, -1))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_bpe_trained_on_special_token_strings_keeps_them_text(data):
    """Trained on text holding "<s>" or "<pad>" (markup, corpora that write "<unk>"), BPE
    learned merges such as ("<", "s>") whose result is the special token's string, so
    "b<s>" encoded to [▁, b, <s>]: a BOS inside the sentence (EOS for "</s>", a pad that
    breaks the source mask for "<pad>"), and decoding dropped it ("b")."""
    part = st.sampled_from(["a", "b", "c", *SPECIAL_TOKENS])
    word = st.lists(part, min_size=1, max_size=4).map("".join)
    texts = data.draw(
        st.lists(st.lists(word, min_size=1, max_size=4).map(" ".join), min_size=1, max_size=6)
    )
    alphabet = "a b c < > / s p d u n k"  # every character seen, spaced: never merged
    bpe = BPETokenizer.train([alphabet] + texts * 30, vocab_size=200, min_frequency=1)
    probe = data.draw(st.lists(word, min_size=1, max_size=5).map(" ".join))
    for text in [*texts, probe, "b<s>", "c</s>a <pad>"]:
        ids = bpe.encode(text)
        assert min(ids) >= len(SPECIAL_TOKENS) and bpe.decode(ids) == text
    restored = tokenizer_from_json(bpe.to_json())
    assert restored.encode(probe) == bpe.encode(probe)


@pytest.mark.parametrize("kind", ["char", "word"])
def test_json_vocabulary_without_the_special_tokens_first_is_refused(kind):
    """The constructor puts the special tokens first, so a stored vocabulary without them
    there loaded with every id shifted: a model then read other words behind its ids."""
    good = json.loads(train_tokenizers(kind, ["ab"], ["ab"])[0].to_json())
    assert tokenizer_from_json(json.dumps(good)).to_json() == json.dumps(good, ensure_ascii=False)
    for vocab in (["a", *SPECIAL_TOKENS], ["a", "b"], good["vocab"][1:]):
        with pytest.raises(ValueError, match=rf"^{kind} tokenizer JSON: 'vocab' must start with"):
            tokenizer_from_json(json.dumps({**good, "vocab": vocab}))
    with pytest.raises(ValueError, match=r"^vocabulary has duplicate tokens$"):
        tokenizer_from_json(json.dumps({**good, "vocab": [*good["vocab"], good["vocab"][-1]]}))


def test_other_stored_tokenizers_that_cannot_load_say_why(toy_bpe):
    """A tokenizer of another format version, a BPE tokenizer whose 'tokenizer' is not an
    object or lacks the special tokens at their ids, and an unknown kind to train."""
    good = json.loads(toy_bpe.to_json())
    with pytest.raises(ValueError, match=r"^tokenizer JSON version 2, expected 1$"):
        tokenizer_from_json(json.dumps({**good, "version": 2}))
    with pytest.raises(ValueError, match=r"^bpe tokenizer JSON: 'tokenizer' must be an object$"):
        tokenizer_from_json(json.dumps({**good, "tokenizer": []}))
    vocab = good["tokenizer"]["model"]["vocab"]
    first, second = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two special ids swapped
    with pytest.raises(ValueError, match=rf"^BPE vocabulary must have {first} at id 0$"):
        tokenizer_from_json(json.dumps(good))
    with pytest.raises(ValueError, match=r"^unknown tokenizer kind 'sentencepiece'; expected"):
        train_tokenizers("sentencepiece", ["ab"], ["ab"])


def test_bytes_to_unicode_spells_every_byte_once():
    spelling = bytes_to_unicode()
    assert len(set(spelling.values())) == 256 and spelling[ord("A")] == "A"
    assert spelling[ord(" ")] == "Ġ" and spelling[ord("\n")] == "Ċ"  # GPT-2's space, newline
