"""Decode attention: GB/s of K/V read against the device's own streaming-read ceiling.

    python3 bench/decode_attention.py [--device N] [--shape B,Hq,Hkv,Lk,D ...]
        [--dtype float32|float16 ...] [--quick] [--json FILE] [--plot FILE.png]

The same as ``pootvk bench`` (pootvk/benchmark.py says what is measured and how): the read
ceiling, pootvk per shape and K/V dtype, the host overhead of a replayed decode step, and,
where present, torch SDPA (CUDA graph) and llama.cpp's Vulkan flash attention, all in one
run. Prints markdown tables of ratios (BENCHMARKS.md keeps results).
"""

import sys

from pootvk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
