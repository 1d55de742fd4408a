"""Lengths are run-time values: a new key count reuses the compiled SPIR-V (issue 6 item 3).

Lk reaches the attention kernel as a push constant, so the generated source, the SPIR-V
and the driver's pipeline are the same for every length.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

import pootvk
from pootvk.compile import compile_graph
from pootvk.ops import trace_attention
from pootvk.plan import plan_graph, recorded_profile
from pootvk.shaders import compiler
from pootvk.shaders.generate import generate
from tests.helpers import assert_close, reference_attention


def test_the_source_does_not_depend_on_the_length():
    g = compile_graph(trace_attention((1, 8, 1, 128), (1, 2, 300, 128), (1, 2, 300, 128)))
    req = plan_graph(g, recorded_profile("lavapipe")).kernels[0].request
    other = replace(req, lk=301)
    assert generate(req) == generate(other)
    assert req.push_constants() == (300,) and other.push_constants() == (301,)


def test_a_new_length_compiles_nothing_and_is_fast(device):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32)

    def kv(lk: int) -> np.ndarray:
        return rng.standard_normal((1, 2, lk, 128), dtype=np.float32)

    k = kv(500)
    pootvk.attention(q, k, k, device=device)  # the first length compiles
    calls = compiler.glslang_calls
    for lk in (501, 777, 1):
        k = kv(lk)
        t0 = time.perf_counter()
        out = pootvk.attention(q, k, k, device=device)
        dt = time.perf_counter() - t0
        assert compiler.glslang_calls == calls, f"Lk={lk} ran glslang again"
        assert dt <= 0.5, f"a new Lk={lk} at D=128 took {dt:.2f} s (goal 0.5 s)"
        assert_close(out, reference_attention(q, k, k))
