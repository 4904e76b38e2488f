"""The engine under every language model: one generation loop, and the runners of each
forward pass behind a dispatcher that says why it chose one.

- :mod:`~qkv.engine.loop`: the loop (``steps``), one token a step, greedy or sampled;
  :mod:`~qkv.engine.beam`: beam search over the same step; :mod:`~qkv.engine.sampling`:
  how a token is chosen;
- :mod:`~qkv.engine.generation`: what users call, ids to ids (``model.generate``) or text
  to streamed text (:func:`generate`);
- :mod:`~qkv.engine.dispatch`: which runner computes a pass (:func:`explain_runner`):
  the model's own forward (:mod:`~qkv.engine.runner`), a float32 prompt's small steps in
  C (:mod:`~qkv.engine.c_prompt`), one token through each block in one C call
  (:mod:`~qkv.engine.c_token`);
- :mod:`~qkv.engine.generated_attention`: the attention of generated tokens.
"""

from qkv.engine.dispatch import PREFERENCE, RunnerChoice, explain_runner, get_runner, run
from qkv.engine.generated_attention import generate_with_attention, sink_and_previous_shares
from qkv.engine.generation import TextStream, encode_text, generate, generate_ids
from qkv.engine.loop import CONTEXT_POLICIES, Step, next_logits, steps
from qkv.engine.sampling import DecodingRules, adjust_logits, filter_logits, sample_next

__all__ = [
    "CONTEXT_POLICIES",
    "DecodingRules",
    "PREFERENCE",
    "RunnerChoice",
    "Step",
    "TextStream",
    "adjust_logits",
    "encode_text",
    "explain_runner",
    "filter_logits",
    "generate",
    "generate_ids",
    "generate_with_attention",
    "get_runner",
    "next_logits",
    "run",
    "sample_next",
    "sink_and_previous_shares",
    "steps",
]
