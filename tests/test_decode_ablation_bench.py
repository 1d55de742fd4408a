"""bench/decode_ablation.py: every cut of a planned decode kernel compiles and returns at
the point it names, and a quick run on the CI device times the whole kernel (checked
against float64) against its cuts."""

import re

import pytest

from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule
from pootvk.plan.profile import recorded_profile
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from tests.helpers import load_bench

CUTS = ["loop", "bar1", "bar2", "stores", "arrival", "combine"]


def _source(**ov):
    p = DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=32768, dk=128, dv=128, scale=0.1,
                      kv_dtype="f16")
    r = choose_decode_schedule(p, recorded_profile("nvidia_h200"), has_subgroup_shuffle=True,
                               overrides=ov or None)
    return generate_decode(r)[0]


@pytest.mark.parametrize("ov", [{"matrix": 16, "matrix_feed": "registers"}, {"matrix": 0}],
                         ids=["register-fed", "scalar"])
def test_cuts_compile_and_return_in_kernel_order(ov):
    mod = load_bench("decode_ablation")
    src = _source(**ov)
    assert mod.cut(src, "none") == src
    where = []
    for name in CUTS:
        got = mod.cut(src, name)
        lines = got.split("\n")
        assert lines.count(mod.CUT) == 1
        where.append(lines.index(mod.CUT))
        assert len(compile_glsl(got)) > 100
    assert where == sorted(where) and len(set(where)) == len(where)
    before = got.split("\n")[where[-1] - 1].strip()  # the combine cut follows the atomic's
    assert before.startswith("if (s_last == 0u)")
    if ov["matrix"]:
        twice = mod.cut(src, "fold2")
        assert re.search(r"for \(uint rep = 0u; rep < nrep; \+\+rep\)", twice)
        compile_glsl(twice)


def test_decode_ablation_quick(capsys):
    rc = load_bench("decode_ablation").main(
        ["--shape", "1,8,2,256", "--variant", '{"splits": 4, "local_size": 64}', "--cut",
         "none", "loop", "arrival", "--rounds", "1", "--reps", "1", "--warm", "0.01"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "splits=4" in text and "fused" in text
    err = float(re.search(r"none .* nse (\S+)", text).group(1))
    assert err <= 5e-4
    assert re.search(r"loop .*cut: output not checked", text)
    assert re.search(r"arrival .*cut: output not checked", text)
