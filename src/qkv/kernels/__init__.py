"""Behind the formula: the attention backends and the dispatch that chooses between them.

:mod:`qkv.attention` is the formula; everything here computes the same thing faster and is
tested against it. :mod:`~qkv.kernels.dispatch` holds the registry and ``auto``'s choice,
each backend says why it cannot serve a request (``why_not``), and :mod:`~qkv.kernels.cpu`
holds the CPU-specific tuning. Import the module you need; this package imports nothing.
"""
