"""Decode attention: GB/s of K/V read against the device's own streaming-read ceiling.

    python3 bench/decode_attention.py [--device N] [--shape B,Hq,Hkv,Lk,D ...]

Measured in one run: the ceiling (a plain vec4 read kernel over random words), the attention
kernel's GPU time from timestamps, the step's wall time from Python, and the numpy oracle's
time on the same shapes. Prints a markdown table of ratios (BENCHMARKS.md keeps results).
"""

import sys

from pootvk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
