"""Lengths are run-time values: a new key count reuses the compiled SPIR-V (issue 6 item 3).

Lk reaches the attention kernel as a push constant, so the generated source, the SPIR-V
and the driver's pipeline are the same for every length.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

import pootvk
from pootvk.ops import trace_attention
from pootvk.passes import compile_graph
from pootvk.plan import DecodeCombineRequest, plan_graph, recorded_profile
from pootvk.shaders import compiler
from pootvk.shaders.generate import generate
from tests.helpers import assert_close, reference_attention


def test_the_source_does_not_depend_on_the_length():
    g = compile_graph(trace_attention((1, 8, 1, 128), (1, 2, 300, 128), (1, 2, 300, 128)))
    req = plan_graph(g, recorded_profile("lavapipe")).kernels[0].request
    other = replace(req, lk=301)
    assert generate(req) == generate(other)
    assert req.push_constants() == (300,) and other.push_constants() == (301,)


def _kernels(lk: int, profile) -> set:
    """The plan's kernel requests for this length with Lk blanked: what sources depend on
    (a split plan may have two kernels: the partials and their combine)."""
    g = compile_graph(trace_attention((1, 8, 1, 128), (1, 2, lk, 128), (1, 2, lk, 128)))
    out = set()
    for k in plan_graph(g, profile).kernels:
        r = k.request
        if isinstance(r, DecodeCombineRequest):
            out.add(DecodeCombineRequest(replace(r.partial, lk=0)))
        else:
            out.add(replace(r, lk=0))
    return out


def test_a_new_length_compiles_nothing_and_is_fast(device):
    """A new length with the same schedule compiles nothing. On a GPU the split count may
    follow the length (more keys, more splits): a new split count is a new kernel, compiled
    once; on lavapipe (never split) no length compiles and each costs <= 0.5 s."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32)

    def kv(lk: int) -> np.ndarray:
        return rng.standard_normal((1, 2, lk, 128), dtype=np.float32)

    k = kv(500)
    pootvk.attention(q, k, k, device=device)  # the first length compiles
    seen = _kernels(500, device.profile)
    for lk in (501, 777, 1, 5000, 5001):
        calls = compiler.glslang_calls
        fresh = _kernels(lk, device.profile) - seen  # kernels no earlier length needed
        seen |= fresh
        new = bool(fresh)
        k = kv(lk)
        t0 = time.perf_counter()
        out = pootvk.attention(q, k, k, device=device)
        dt = time.perf_counter() - t0
        assert compiler.glslang_calls - calls <= len(fresh), f"Lk={lk} recompiled"
        if device.profile.device_type == "cpu":
            assert not new, "lavapipe's schedule does not follow the length"
            assert dt <= 0.5, f"a new Lk={lk} at D=128 took {dt:.2f} s (goal 0.5 s)"
        assert_close(out, reference_attention(q, k, k))
