"""bench/sparse_decode.py --quick runs as the lead runs it on the GPU (here on lavapipe):
the sparse step, the sparse step with the in-graph indexer and dense attention at each
length, every output checked against float64, every plan's kernels timed."""

import json

from tests.helpers import load_bench


def test_sparse_bench_quick(capsys, device, tmp_path):
    mod = load_bench("sparse_decode")
    out_json = tmp_path / "sparse.json"
    assert mod.main(["--quick", "--reps", "2", "--lk", "512,2048", "--variants",
                     '[{"schedule": "grouped", "rows_per_wg": 2}]', "--json",
                     str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| Lk | series | us | vs dense |" in out and "sparse step:" in out
    rows = json.loads(out_json.read_text())["rows"]
    series = {(r["lk"], r["series"]) for r in rows}
    for lk in (512, 2048):
        assert {(lk, "sparse"), (lk, "sparse + indexer"), (lk, "dense")} <= series
    for r in rows:
        assert r["nse"] <= 5e-4 and r["us"] > 0, r
        assert len(r["kernels"]) >= 1
    sparse = [r for r in rows if r["series"] == "sparse"]
    assert any("BlockTopK" in k for k in sparse[0]["kernels"])
    assert any("selected" in k for k in sparse[0]["kernels"])
