"""Workgroup memory of every generated kernel, read from its SPIR-V, against the limit of the
profile it was planned for.

Why: a kernel over ``maxComputeSharedMemorySize`` is invalid, and the H200 (49152 bytes) lost
the device on a decode kernel 4 bytes over it (the fused combine's arrival flag was not
counted). lavapipe's own limit is larger, so the validation layer in CI never sees it: this
test counts the bytes independently of the planner's formulas, for every recorded profile.
"""

from __future__ import annotations

import itertools
import struct

import pytest

from pootvk.passes import canonicalize, compile_graph, gate_state_writes
from pootvk.plan import plan_graph, recorded_profiles
from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule
from pootvk.shaders.attention_decode import generate_decode_partial
from pootvk.shaders.compiler import compile_glsl
from pootvk.shaders.generate import generate
from tests.shaders.test_generated import graphs

WORKGROUP = 4  # SPIR-V storage class
OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR = 20, 21, 22, 23
OP_TYPE_ARRAY, OP_TYPE_STRUCT, OP_CONSTANT, OP_TYPE_POINTER, OP_VARIABLE = 28, 30, 43, 32, 59


def workgroup_bytes(spirv: bytes) -> int:
    """Bytes of every Workgroup-storage variable of a SPIR-V module (tightly packed)."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    size: dict[int, int] = {}
    const: dict[int, int] = {}
    pointee: dict[int, int] = {}
    total, i = 0, 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        a = words[i + 1:i + n]
        if op == OP_TYPE_BOOL:
            size[a[0]] = 4
        elif op in (OP_TYPE_INT, OP_TYPE_FLOAT):
            size[a[0]] = a[1] // 8
        elif op == OP_TYPE_VECTOR:
            size[a[0]] = size[a[1]] * a[2]
        elif op == OP_TYPE_ARRAY:
            size[a[0]] = size[a[1]] * const[a[2]]
        elif op == OP_TYPE_STRUCT and all(m in size for m in a[1:]):
            size[a[0]] = sum(size[m] for m in a[1:])  # (buffer blocks hold runtime arrays)
        elif op == OP_CONSTANT:
            const[a[1]] = a[2]
        elif op == OP_TYPE_POINTER and a[1] == WORKGROUP:
            pointee[a[0]] = a[2]
        elif op == OP_VARIABLE and a[2] == WORKGROUP:
            total += size[pointee[a[0]]]
        i += n
    return total


def test_the_count_reads_shared_declarations():
    src = ("#version 450\nlayout(local_size_x = 64) in;\nshared float a[100];\n"
           "shared vec4 b[3];\nshared uint c;\n"
           "layout(std430, binding = 0) buffer B { float y[]; };\n"
           "void main() { a[gl_LocalInvocationID.x] = 1.0; b[0] = vec4(a[1]); c = 1u;"
           " barrier(); y[0] = b[0].x + a[2] + float(c); }\n")
    assert workgroup_bytes(compile_glsl(src)) == 400 + 48 + 4


def _planned():
    for g in graphs():
        for prof in recorded_profiles().values():
            try:
                for compiled in (compile_graph(g), gate_state_writes(canonicalize(g))):
                    for k in plan_graph(compiled, prof).kernels:
                        yield prof, generate(k.request)
            except Exception:  # noqa: BLE001  (refusals are tested where they are made)
                continue


def test_every_planned_kernel_fits_its_profiles_workgroup_memory():
    seen = {}
    for prof, src in _planned():
        seen.setdefault((prof.name, src), prof)
    assert len(seen) > 40
    for (name, src), prof in seen.items():
        used = workgroup_bytes(compile_glsl(src))
        assert used <= prof.max_workgroup_memory, (name, used, src.splitlines()[:3])


@pytest.mark.parametrize("prof", list(recorded_profiles().values()), ids=lambda p: p.name)
def test_decode_schedules_count_their_workgroup_memory(prof):
    """The formula the chooser fits with (``DecodeRequest.shared_bytes``) covers what the
    kernel declares, over the schedule knobs that change it, at head widths near the limit."""
    if not prof.extra.get("storage_buffer_16bit"):
        kvs = ("f32",)
    else:
        kvs = ("f32", "f16")
    checked = 0
    for kv, (dk, dv), sub, splits in itertools.product(
            kvs, ((128, 128), (40, 72), (256, 256), (576, 512)), (True, False), (1, 7)):
        p = DecodeProblem(b=1, hq=8, hkv=1, lq=3 if dk == 40 else 1, lk=1000, dk=dk, dv=dv,
                          scale=0.1, kv_dtype=kv)
        try:
            r = choose_decode_schedule(p, prof, has_subgroup_shuffle=sub, force_splits=splits,
                                       overrides={"subgroup": sub})
        except Exception:  # noqa: BLE001  (AttentionLds and friends: refused, not generated)
            continue
        used = workgroup_bytes(compile_glsl(generate_decode_partial(r)))
        assert used <= r.shared_bytes <= prof.max_workgroup_memory, (r.describe(), used)
        checked += 1
    assert checked >= 4
