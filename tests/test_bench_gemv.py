"""bench/gemv.py runs on the CI device (a quick smoke run): every case checked against
float64 numpy, the table printed, a tune variant timed."""

import json

from tests.helpers import load_bench


def _bench():
    return load_bench("gemv")


def test_gemv_bench_quick(tmp_path, capsys, device):
    out = tmp_path / "g.json"
    rc = _bench().main(["--quick", "--tune", "--shape", "72,40", "--dtype", "f16",
                        "--layout", "kn", "--reps", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "read ceiling:" in text and "| 72,40 | 1 | f16 | kn |" in text and "best:" in text
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["ok"] and row["nse"] < 1e-10 and row["kernel"].startswith("matmul gemv_n")
    # 4 single-launch variants and one split-K (partial + combine, its own replay)
    assert len(res["tuned"]) == 5 and all(t["ok"] for t in res["tuned"])
    assert res["tuned"][-1]["splits"] > 1 and " splits=" in text


def test_gemm_bench_quick(tmp_path, capsys, device):
    """--gemm: prefill rows run the tiled GEMM, checked, with TFLOP/s and tile variants."""
    out = tmp_path / "g.json"
    rc = _bench().main(["--quick", "--gemm", "--rows", "20", "--tune", "--shape", "40,36",
                        "--dtype", "f32", "--layout", "nk", "--reps", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "| 40,36 | 20 | f32 | nk |" in text and "TFLOP/s" in text
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["ok"] and row["nse"] < 1e-10 and row["kernel"].startswith("matmul gemm")
    assert row["m"] == 20 and row["tflops"] > 0
    # the quick variants: two single-launch tiles and one split-K (partial + combine)
    assert len(res["tuned"]) == 3 and all(t["ok"] and t["kind"] == "gemm" for t in res["tuned"])
    assert [t["splits"] for t in res["tuned"]] == [1, 1, 2] and " splits=2 " in text
    assert "FP32 FMA peak:" in text


def test_gemm_bench_forced_variant(tmp_path, capsys, device):
    """--gemm-variant times only the named shapes; --peak-tflops sets the peak line."""
    out = tmp_path / "g.json"
    rc = _bench().main(["--quick", "--gemm", "--rows", "12", "--shape", "24,40", "--dtype",
                        "f16", "--layout", "kn", "--reps", "2", "--gemm-variant",
                        "32,64,4,8,8,2", "--peak-tflops", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())
    (t,) = res["tuned"]
    assert t["ok"] and (t["tile_m"], t["tile_n"], t["thread_n"], t["splits"]) == (32, 64, 8, 2)
    assert "tile=32x64x8 thread=4x8" in t["kernel"] and res["fp32_peak_tflops"] == 1
    assert t["peak_frac"] == t["tflops"] and "of FP32 peak" in text
