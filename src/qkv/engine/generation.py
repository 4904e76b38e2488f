"""Generation as users call it: token ids in and out (as transformers' ``generate``), or
text in and text out, streamed (:func:`generate`), both over the one loop of
:mod:`qkv.engine.loop`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from qkv.engine.beam import beam_decode
from qkv.engine.loop import check_positions, steps
from qkv.engine.sampling import DecodingRules, prompt_mask
from qkv.kernels.cpu.memory import reuse_freed_memory

__all__ = ["TextStream", "encode_text", "generate", "generate_ids"]


@torch.no_grad()
def generate_ids(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    rules: DecodingRules | None = None,
    *,
    seed: int | None = None,
    use_cache: bool = True,
    attention_mask: Tensor | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    runner: str = "auto",
) -> Tensor:
    """The prompts followed by their continuations, as transformers' ``generate`` (the
    arguments of :meth:`~qkv.models.pretrained.causal_lm.CausalLM.generate`, the choice of
    each token as ``rules``, default greedy): :func:`~qkv.engine.loop.steps` gathered, or
    beam search when ``num_beams > 1``.

    Returns:
        ``(B * num_return_sequences, T + N)``.
    """
    rules = rules or DecodingRules()
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the prompts' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask is None:
        attention_mask = prompt_mask(input_ids, rules)
    if num_beams != 1:
        check_positions(model, input_ids.shape[1], max_new_tokens)
        with reuse_freed_memory():
            return beam_decode(
                model,
                input_ids,
                max_new_tokens,
                num_beams,
                rules,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
                num_return_sequences=num_return_sequences,
                attention_mask=attention_mask,
                runner=runner,
            )
    if num_return_sequences != 1:
        if num_return_sequences < 1 or rules.temperature <= 0:
            raise ValueError(
                f"greedy decoding gives one continuation per prompt, not {num_return_sequences}:"
                " sample (temperature > 0) or search with num_beams >= num_return_sequences"
            )
        input_ids = input_ids.repeat_interleave(num_return_sequences, 0)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat_interleave(num_return_sequences, 0)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    with reuse_freed_memory():
        made = [
            step.tokens[:, None]
            for step in steps(
                model,
                input_ids,
                max_new_tokens,
                rules,
                attention_mask=attention_mask,
                use_cache=use_cache,
                generator=generator,
                runner=runner,
            )
        ]
    return torch.cat([input_ids, *made], dim=1)


class TextStream:
    """The text of a continuation, piece by piece, as it is generated (:func:`generate`).

    Iterating yields each new piece of text as soon as its tokens are chosen: the whole
    text so far is decoded at each token and its new part given, once it does not end
    inside a UTF-8 character (a byte token in the middle of one decodes to U+FFFD) and
    cannot be the start of a stop string. After the iteration:

    Attributes:
        prompt_ids: the prompt's token ids.
        token_ids: the new token ids (an end token included).
        finish_reason: ``"stop"`` (an end token or a stop string) or ``"length"``
            (``max_new_tokens``, or the model's context, ran out); ``None`` before the end.
        text: the text given so far.
    """

    def __init__(self, tokens, decode, prompt_ids: list[int], ends, stop: Sequence[str]):
        self._tokens, self._decode, self._ends = tokens, decode, set(ends)
        self.prompt_ids, self.token_ids = prompt_ids, []
        self.stop = [s for s in stop if s]
        self.finish_reason: str | None = None
        self.text = ""

    def __iter__(self) -> Iterator[str]:
        for token in self._tokens:
            self.token_ids.append(token)
            if token in self._ends:
                self.finish_reason = "stop"
                break
            full = self._text()
            if full.endswith("\ufffd"):
                continue  # a character split over tokens: wait for the rest of it
            cut = _stop_at(full, self.stop, len(self.text))
            if cut is not None:
                self.finish_reason = "stop"
                yield from self._give(full[:cut])
                return
            yield from self._give(full[: len(full) - _held_back(full, self.stop)])
        else:
            self.finish_reason = "length"
        full = self._text()  # what was held back, and a character left unfinished
        cut = _stop_at(full, self.stop, len(self.text))
        yield from self._give(full if cut is None else full[:cut])

    def _text(self) -> str:
        return self._decode([t for t in self.token_ids if t not in self._ends])

    def _give(self, text: str):
        if len(text) > len(self.text):
            piece, self.text = text[len(self.text) :], text
            yield piece


def _stop_at(text: str, stop: Sequence[str], given: int) -> int | None:
    """Where the first stop string in ``text`` starts (searching from where it could
    begin, the text before ``given`` having been given), or ``None``."""
    found = [at for s in stop if (at := text.find(s, max(0, given - len(s) + 1))) >= 0]
    return min(found) if found else None


def _held_back(text: str, stop: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may start a stop string."""
    return max(
        (
            n
            for s in stop
            for n in range(min(len(s) - 1, len(text)), 0, -1)
            if s.startswith(text[-n:])
        ),
        default=0,
    )


def encode_text(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text``'s token ids by ``tokenizer``: a Hugging Face ``tokenizers.Tokenizer``
    (its ``Encoding``'s ids) or a qkv :class:`~qkv.data.tokenizers.Tokenizer` (a list)."""
    out = (
        tokenizer.encode(text)
        if add_special_tokens
        else tokenizer.encode(text, add_special_tokens=False)
    )
    return list(getattr(out, "ids", out))


def generate(
    model: nn.Module,
    tokenizer,
    prompt: str | Sequence[int],
    max_new_tokens: int = 128,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    eos_token_id: int | Sequence[int] | None = None,
    repetition_penalty: float = 1.0,
    suppress_tokens: Sequence[int] = (),
    add_special_tokens: bool = True,
    context: str = "error",
    runner: str = "auto",
) -> TextStream:
    """Continue ``prompt`` and stream the new text, piece by piece.

    >>> for piece in qkv.generate(model, tokenizer, "The capital of France is"):  # doctest: +SKIP
    ...     print(piece, end="", flush=True)

    Args:
        model: a decoder-only language model (:class:`~qkv.models.GPT`,
            :class:`~qkv.models.Llama`; ``qkv.load(path).model``).
        tokenizer: its tokenizer (a Hugging Face ``tokenizers.Tokenizer`` or a qkv one).
        prompt: the text, or its token ids.
        max_new_tokens: at most this many new tokens (fewer when the model's context ends
            first, with ``context="error"``).
        temperature, top_k, top_p, seed, repetition_penalty, suppress_tokens: how each
            token is chosen (:class:`~qkv.engine.sampling.DecodingRules`; temperature 0:
            greedy).
        stop: strings that end the text where they first appear (not given).
        eos_token_id: end tokens (``None``: the model's ``generation_defaults``, as
            ``model.generate`` takes them; ``[]``: none).
        add_special_tokens: let the tokenizer add its own (a BOS token): ``False`` for a
            prompt that a chat template has written out already.
        context: the context policy of :func:`~qkv.engine.loop.steps` (``"crop"`` keeps
            the latest tokens of a model with learned positions).
        runner: the runner of each forward pass (``"auto"``; ``"forward"``: the model's
            own forward).

    Returns:
        a :class:`TextStream`: iterate it for the pieces; it then holds the token ids and
        why it ended.
    """
    ids = (
        encode_text(tokenizer, prompt, add_special_tokens)
        if isinstance(prompt, str)
        else list(prompt)
    )
    if not ids:
        raise ValueError("the prompt gives no token")
    defaults = getattr(model, "generation_defaults", None)
    if eos_token_id is None:
        eos_token_id = list(defaults.eos_token_id) if defaults is not None else []
    ends = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    limit = getattr(model, "max_positions", None)
    if context == "error" and limit is not None:
        if len(ids) >= limit:
            raise ValueError(f"the prompt has {len(ids)} tokens; the model's context is {limit}")
        max_new_tokens = min(max_new_tokens, limit - len(ids))
    rules = DecodingRules(
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        eos_token_id=ends or None,
        suppress_tokens=tuple(suppress_tokens),
    )
    device = next(model.parameters()).device
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    tokens = (
        int(step.tokens[0])
        for step in steps(
            model,
            torch.tensor([ids], device=device),
            max_new_tokens,
            rules,
            generator=generator,
            context=context,
            runner=runner,
        )
    )
    return TextStream(tokens, tokenizer.decode, ids, ends, stop)
