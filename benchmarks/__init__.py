"""qkv's benchmarks: each module has ``run(out_dir, quick=False) -> dict``."""
