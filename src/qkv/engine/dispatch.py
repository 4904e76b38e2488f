"""Which runner computes a forward pass, and why not the others.

Every runner declares what it cannot serve (:meth:`~qkv.engine.runner.Runner.why_not`);
``auto`` takes the first in :data:`PREFERENCE` that can, and :func:`explain_runner` says
for a model and a call which runner serves and why each other one does not (as
:func:`qkv.explain_dispatch` does for attention's backends). The model's own ``forward``
comes last and serves every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from qkv.engine.c_prompt import PromptStepsRunner
from qkv.engine.c_token import TokenLayersRunner
from qkv.engine.runner import ForwardCall, ForwardRunner, Runner
from qkv.kernels.dispatch import choice_report
from qkv.modules.decoder import CausalLMOutput

__all__ = ["PREFERENCE", "RunnerChoice", "explain_runner", "get_runner", "run"]

_RUNNERS: dict[str, Runner] = {
    r.name: r for r in (TokenLayersRunner(), PromptStepsRunner(), ForwardRunner())
}
PREFERENCE = ["c_token", "c_prompt", "forward"]  # fastest first; forward serves everything


@dataclass
class RunnerChoice:
    """Which runner serves a call and why each other one does not."""

    chosen: str
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        return choice_report(self.chosen, PREFERENCE, self.reasons)


def get_runner(name: str) -> Runner:
    """The runner called ``name``; ``ValueError`` listing the known names otherwise."""
    if name not in _RUNNERS:
        raise ValueError(f"unknown runner {name!r}; known: {', '.join(PREFERENCE)}")
    return _RUNNERS[name]


def _choose(call: ForwardCall, complete: bool) -> RunnerChoice:
    reasons: dict[str, list[str]] = {}
    chosen = None
    for name in PREFERENCE:
        if chosen is not None and not complete:
            break
        reasons[name] = _RUNNERS[name].why_not(call)
        if chosen is None and not reasons[name]:
            chosen = name
    return RunnerChoice(chosen=chosen or "forward", reasons=reasons)


def explain_runner(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, **forward: Any
) -> RunnerChoice:
    """Which runner :func:`run` (``runner="auto"``) takes for this call of ``model``, and
    why each other one is not used; nothing runs, nothing is cached. ``str()`` of the
    result is a short report, one line per runner. ``forward``: the keyword arguments of
    the model's forward (``cache``, ``need_weights``, ``position_ids``,
    ``logits_to_keep``).

    Example:
        >>> print(qkv.explain_runner(model, ids, cache=cache))  # doctest: +SKIP
        auto -> c_token
          c_token: chosen
          c_prompt: could run, but c_token comes first
          forward: could run, but c_token comes first
    """
    return _choose(ForwardCall(model, input_ids, attention_mask, **forward), complete=True)


def run(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    runner: str = "auto",
    **forward: Any,
) -> CausalLMOutput:
    """``model(input_ids, attention_mask, **forward)``, computed by a runner: the first of
    :data:`PREFERENCE` that serves the call (``"auto"``), or the one named (``"forward"``
    is the model's own forward; a named runner that cannot serve the call is a
    ``ValueError`` saying why). ``forward``: the keyword arguments of the model's forward
    (``cache``, ``need_weights``, ``position_ids``, ``logits_to_keep``).

    Returns:
        what the model's ``forward`` returns (a
        :class:`~qkv.modules.decoder.CausalLMOutput`), within the runner's rounding.
    """
    call = ForwardCall(model, input_ids, attention_mask, **forward)
    if runner == "auto":
        return _RUNNERS[_choose(call, complete=False).chosen](call)
    chosen = get_runner(runner)
    why = chosen.why_not(call)
    if why:
        raise ValueError(f"runner {runner!r} cannot serve this call: " + "; ".join(why))
    return chosen(call)
