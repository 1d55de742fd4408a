"""bench/coopmat_peak.py and bench/mla_phases.py: their kernels compile, the phase probe marks
the key loop's barriers, and both say why they cannot run where the device lacks
VK_KHR_cooperative_matrix (lavapipe)."""

import re

from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule
from pootvk.plan.profile import recorded_profile
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from tests.helpers import load_bench

H200 = recorded_profile("nvidia_h200")
MLA = DecodeProblem(b=1, hq=128, hkv=1, lq=1, lk=32768, dk=576, dv=512, scale=576 ** -0.5,
                    kv_dtype="f16", dk_shared=64)


def test_coopmat_peak_kernels_compile_and_count_their_products():
    mod = load_bench("coopmat_peak")
    for shared_a in (False, True):
        for acc in (1, 8):
            src = mod.source(256, acc, 64, shared_a)
            assert src.count("coopMatMulAdd") == acc  # one product per accumulator a step
            assert ("coopMatLoad(a, sA, ((it" in src) == shared_a
            compile_glsl(src)
    assert mod.MLA_FLOP == 2 * 128 * 32768 * 1088 and mod.MLA_BYTES == 32768 * 1088 * 2


def test_mla_phases_marks_each_barrier_of_the_step():
    mod = load_bench("mla_phases")
    for ov, copies in (({}, 1), ({"prefetch_steps": 2}, 2)):
        r = choose_decode_schedule(MLA, H200, has_subgroup_shuffle=True, overrides=ov)
        src, names, npro = mod.instrument(generate_decode(r)[0], len(r.bindings()))
        # four barriers a step (copy, scores, softmax, P V), once per unrolled copy; the
        # rescale branch's barriers are part of phase 4, not phases of their own
        assert names == [f"{w} {i}" for i in range(1, 4 * copies + 1) for w in ("work", "wait")]
        assert npro == 2 * (r.rows_per_wg // 16)  # two barriers per query row tile
        assert len(re.findall(r"\bp\d+ \+= c - cp", src)) == len(names)
        assert f"binding = {len(r.bindings())}) buffer Ph" in src
        compile_glsl(src)


def test_probes_run_or_say_why_not(capsys, device):
    """On a device with the 16x16x16 f16 cooperative matrix both probes run (tiny sizes) and
    the phase probe's output matches float64; elsewhere (lavapipe) both exit with 2 and a
    line that says why."""
    peak, phases = load_bench("coopmat_peak"), load_bench("mla_phases")
    small = ["--shape", "1,32,1,256,192,64,256", "--reps", "2", "--warm", "0.01"]
    if "16x16x16 f16 f16 f32 f32" in (device.profile.extra.get("coopmat") or ()):
        assert peak.main(["--iters", "16", "--reps", "2", "--warm", "0.01"]) == 0
        assert "TFLOP/s" in capsys.readouterr().out
        assert phases.main(small) == 0  # 1 when an output misses the float64 reference
        assert "cycles" in capsys.readouterr().out
        return
    assert peak.main(["--reps", "1"]) == 2
    assert "nothing to probe" in capsys.readouterr().out
    assert phases.main(small) == 2
    out = capsys.readouterr().out
    assert "cannot run here" in out or "no VK_KHR_shader_clock" in out
