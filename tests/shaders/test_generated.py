"""Every generated kernel compiles, passes spirv-val, and keeps no private arrays."""

import re
import shutil
import subprocess

from pootvk.ir import BF16, F16, F32, I32, PRIMS, shape_rules
from pootvk.llm import LlamaConfig, trace_llama
from pootvk.ops import Builder, trace_attention, trace_decode_step
from pootvk.oracle import eval_rules
from pootvk.passes import canonicalize, compile_graph, gate_state_writes
from pootvk.plan import forced_schedule, plan_graph, plan_rules, recorded_profile, recorded_profiles
from pootvk.shaders.compiler import compile_glsl
from pootvk.shaders.generate import generate
from pootvk.shaders.matmul import KERNEL_PRIMS
from pootvk.shaders.prims import ROW_KERNELS, glsl_rules
from pootvk.shaders.readbw import generate_read
from pootvk.shaders.table import generators
from tests.random_graphs import rms_norm, swiglu

# A declaration of a non-shared array: `float acc[4];`, `const vec4 t[2] = ...`
PRIVATE_ARRAY = re.compile(
    r"^\s*(?:const\s+)?(?:float|int|uint|bool|[iu]?vec[234]|mat[234])\s+\w+\s*\[", re.M
)


def sixteen_bit_graph(dt):
    """Every arithmetic family at a 16-bit dtype, a scatter and reductions over two axes."""
    b = Builder()
    x, y = b.input("x", (3, 40), dt), b.input("y", (40,), dt)
    s = b.select(b.compare("Gt", x, y), b.unary("Silu", b.add(x, y)), 1.5)
    m = b.max(b.matmul(s, b.transpose(x, (1, 0))), b.convert(b.iota((3, 3), 1), dt))
    b.export("r0", b.reduce("Max", m, 1))
    b.export("r1", b.reduce("Sum", s, 0, keepdim=False))
    b.export("sc", b.scatter_update(x, b.input("i", (2,), I32), b.input("u", (2, 40), dt)))
    return b.build()


def graphs():
    yield sixteen_bit_graph(F16)
    yield sixteen_bit_graph(BF16)
    yield trace_decode_step(2, 8, 2, 64, 16, softcap=30.0, alibi=True)
    yield trace_decode_step(1, 4, 4, 6, 10, q_rows=3)  # scalar (vec 1) path
    yield trace_attention((1, 12, 7, 40), (1, 1, 113, 40), (1, 1, 113, 72), (1, 12, 7, 113))
    yield trace_attention((3, 4, 1, 128), (3, 4, 1000, 128), (3, 4, 1000, 64))
    yield trace_decode_step(2, 8, 2, 64, 300, live=True, alibi=True)  # live + additive mask
    yield trace_attention((2, 4, 1, 40), (2, 1, 113, 40), (2, 1, 113, 40), lengths=True)
    # the test model: Gather of 16-bit and F32 rows, RMSNorm, RoPE, SwiGLU, F16 -> F32
    for dt in ("float32", "float16"):
        yield trace_llama(LlamaConfig(layers=1, q_heads=2, kv_heads=1, head_dim=8, hidden=16,
                                      intermediate=32, vocab=10, capacity=8, weight_dtype=dt))
    # split key (latent attention): k 64 wide + k_shared 32, GQA over two KV heads
    yield trace_attention((2, 8, 1, 96), (2, 2, 300, 64), (2, 2, 300, 64),
                          k_shared_shape=(2, 1, 300, 32))
    yield trace_attention((2, 8, 1, 96), (2, 2, 300, 64), (2, 2, 300, 64),
                          k_shared_shape=(2, 1, 300, 32), lengths=True)  # split + live
    yield matmul_graph()
    yield fused_chains()


def fused_chains():
    """RMSNorm over 16-bit storage, SwiGLU and a Max reduce: the fused kernel families."""
    b = Builder()
    x = b.convert(b.input("x", (2, 96), BF16), F32)
    y = rms_norm(b, x, b.convert(b.param("w", (96,), F16), F32))
    y = swiglu(b, y, b.param("wg", (96, 64)), b.param("wu", (96, 64)))
    b.export("y", b.convert(y, F16))
    b.export("m", b.reduce("Max", b.unary("Exp", b.sub(y, 1.0)), 0, keepdim=False))
    return b.build()


def matmul_graph():
    """Every matmul kernel: GEMV on both weight layouts (F16, BF16), the GEMM (F32, F16)."""
    b = Builder()
    x1, x64 = b.input("x1", (2, 96)), b.input("x64", (64, 96))
    w16 = b.param("w16", (96, 40), F16)
    wbt = b.param("wbt", (40, 96), BF16)
    wt = b.transpose(b.convert(wbt, F32), (1, 0))
    b.export("n", b.matmul(x1, b.convert(w16, F32)))
    b.export("t", b.matmul(x1, wt))
    b.export("g", b.matmul(x64, b.convert(w16, F32)))
    b.export("f", b.matmul(x64, b.param("w32", (96, 40))))
    for dt in (F16, BF16):  # all-16-bit matmuls: a and y 16-bit too (GEMV_N and GEMM)
        w = b.param(f"w{dt.value}", (96, 40), dt)
        for rows in (2, 64):
            b.export(f"h{dt.value}{rows}", b.matmul(b.input(f"x{dt.value}{rows}", (rows, 96), dt),
                                                    w))
    return b.build()


def all_sources():
    for g in graphs():
        has16 = any(s.var.dtype in (F16, BF16) for s in g.slots)
        for prof in recorded_profiles().values():
            if has16 and not prof.extra.get("storage_buffer_16bit"):
                continue  # refused with DtypeLowering (tests/plan covers the refusal)
            # fused and primitive forms (state writes gated on the guards, as compiled)
            for compiled in (compile_graph(g), gate_state_writes(canonicalize(g))):
                for k in plan_graph(compiled, prof).kernels:
                    yield generate(k.request)
    yield generate_read(1 << 20, 1 << 14)


SOURCES = sorted(set(all_sources()))


def test_every_primitive_has_a_rule_in_every_stage():
    for p in PRIMS.values():
        assert p in shape_rules and p in eval_rules and p in plan_rules, p
        assert p.fused or p in glsl_rules or p in KERNEL_PRIMS or p in ROW_KERNELS, p
    own = {*KERNEL_PRIMS, *ROW_KERNELS}  # kernels with a generator of their own
    assert not set(glsl_rules) & own
    assert set(glsl_rules) == {p for p in PRIMS.values() if not p.fused and p not in own}
    assert all(t in generators for t in ROW_KERNELS.values())
    assert len(SOURCES) > 40


def test_no_private_arrays_anywhere():
    for src in SOURCES:
        bad = PRIVATE_ARRAY.findall(src)
        assert not bad, f"private array in generated source: {bad}\n{src}"
    assert PRIVATE_ARRAY.search("void main() {\n    float acc[8];\n")  # the scan can fail
    assert not PRIVATE_ARRAY.search("shared float s_m[64];\n")


def test_attention_state_lives_in_workgroup_memory():
    g = compile_graph(trace_decode_step(1, 8, 2, 64, 16))
    with forced_schedule("streaming"):
        p = plan_graph(g, recorded_profile("lavapipe"))
    src = generate(p.kernels[-1].request)
    assert "shared vec4 s_acc[DV * LANES]" in src
    assert "shared float s_m[LANES]" in src and "shared float s_l[LANES]" in src


def test_every_generated_module_passes_spirv_val(tmp_path):
    exe = shutil.which("spirv-val")
    assert exe, "spirv-val missing: apt-get install spirv-tools"
    for i, src in enumerate(SOURCES):
        path = tmp_path / f"k{i}.spv"
        path.write_bytes(compile_glsl(src))
        r = subprocess.run([exe, "--target-env", "vulkan1.1", str(path)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr + src


def test_the_request_is_the_compile_cache_key():
    from pootvk.shaders import compiler
    from pootvk.shaders.generate import compile_plan

    g = compile_graph(trace_decode_step(1, 4, 2, 16, 24))
    a = compile_plan(plan_graph(g, recorded_profile("lavapipe")))
    calls = compiler.glslang_calls
    b = compile_plan(plan_graph(compile_graph(trace_decode_step(1, 4, 2, 16, 24)),
                                recorded_profile("lavapipe")))
    assert a == b and compiler.glslang_calls == calls
