"""bench/topk.py --quick runs as the lead runs it on the GPU (here on lavapipe): every
case checked against the oracle exactly, a kernel time per case, the table printed; and a
wrong answer makes it exit 1."""

import json

import numpy as np

from tests.helpers import load_bench


def test_topk_bench_quick(capsys, device, tmp_path):
    mod = load_bench("topk")
    out_json = tmp_path / "topk.json"
    assert mod.main(["--quick", "--reps", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| N | rows | kernel | us | SM MHz |" in out and "FAILED" not in out
    rows = json.loads(out_json.read_text())["rows"]
    cases = {(r["n"], r["rows"], r["kernel"]) for r in rows}
    for n in (128, 512, 2048):
        assert {(n, 8, "TopK"), (n, 8, "BlockTopK")} <= cases
    for r in rows:
        assert r["ok"] and r["us"] > 0, r
    assert any(r["kernel"].startswith("floor") for r in rows)


def test_topk_bench_variants_and_a_mismatch(capsys, device, monkeypatch):
    mod = load_bench("topk")
    args = ["--quick", "--reps", "1", "--warm", "0", "--n", "300", "--variants", "all"]
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    for v in ("subgroup", "shared", "stream-subgroup", "stream-shared"):
        assert f"| {v} |" in out
    args[-1] = "lanes=128+subgroup=0,lanes=32+registers=0"  # fields by hand
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    assert "lanes=128 regs=3 shared" in out and "lanes=32 stream subgroup" in out
    real = mod.evaluate

    def wrong(g, ins):  # TopK's answer one index off (the floor's stays right)
        got = real(g, ins)
        return {k: np.where(v == 0, 1, v) if v.dtype == np.int32 else v
                for k, v in got.items()}

    monkeypatch.setattr(mod, "evaluate", wrong)
    assert mod.main(["--quick", "--reps", "1", "--warm", "0", "--n", "128",
                     "--kernels", "TopK"]) == 1
    out = capsys.readouterr().out
    assert "| TopK | " in out and "MISMATCH" in out and "FAILED: TopK N=128" in out
    assert "FAILED: floor" not in out
