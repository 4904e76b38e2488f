"""CPU-specific tuning behind the kernels: the MKL warm-up, memory reuse, 16-bit dropout.

None of it changes a result; each piece runs when what needs it is first used.
"""
