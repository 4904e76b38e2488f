"""Backend tests: without a GPU, Triton kernels run in Triton's CPU interpreter.

Triton chooses between interpreter and compiler when a ``@triton.jit`` function is defined:
its own library (``tl.zeros``, ``tl.sum``, ...) at ``import triton``, qkv's kernels at
``import qkv.kernels.triton_flash``. So ``TRITON_INTERPRET=1`` must be set before either is
first imported, which this conftest does at collection time. The variable is set only for
those imports: ``test_triton_flash.py`` sets it again while its own tests run, so that
``auto`` dispatch in other tests never sends CPU tensors to the (slow) interpreter.
"""

from __future__ import annotations

import contextlib
import importlib
import os

import torch

INTERPRET = not torch.cuda.is_available()


@contextlib.contextmanager
def _interpreter_env():
    """``TRITON_INTERPRET=1`` for the duration of the block, then as it was."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _import_kernels_for_interpreter() -> None:
    with _interpreter_env():
        try:
            import triton  # noqa: F401  (builds triton's own @jit library for the interpreter)
        except ImportError:  # the test module skips itself
            return
        import qkv.kernels.triton_flash as flash
        from qkv.kernels.dispatch import register_backend

        if not flash._BUILT_FOR_INTERPRETER:  # imported earlier for the compiler: rebuild
            flash = importlib.reload(flash)
            register_backend(flash.TritonBackend())


if INTERPRET:
    _import_kernels_for_interpreter()
