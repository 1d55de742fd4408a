"""bench/mla_decode.py --quick runs as the lead will run it on the GPU (here on lavapipe):
every measured schedule checked against float64, bytes counted as k + k_shared + v."""

import json

from tests.helpers import load_bench


def test_mla_bench_quick(capsys, device, tmp_path):
    mod = load_bench("mla_decode")
    out_json = tmp_path / "mla.json"
    assert mod.main(["--quick", "--no-sweep", "--reps", "3", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "all pootvk outputs match the reference" in out and "of ceiling" in out
    res = json.loads(out_json.read_text())
    b, hq, hkv, lk, dk, s, dv = res["shape"]
    assert res["bytes"] == b * lk * ((dk - s) * hkv + s + dv * hkv) * 2  # f16, no broadcast
    (row,) = res["pootvk"]
    assert row["nse"] <= 5e-4 and row["us"] > 0 and 0 < row["frac"]
    assert "shared 32" in row["kernels"][0]  # the split-key kernel, not a dense one
