"""bench/gemv.py runs on the CI device (a quick smoke run): every case checked against
float64 numpy, the table printed, a tune variant timed."""

import importlib.util
import json
from pathlib import Path


def _bench():
    path = Path(__file__).resolve().parent.parent / "bench" / "gemv.py"
    spec = importlib.util.spec_from_file_location("bench_gemv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    assert len(res["tuned"]) == 2 and all(t["ok"] and t["kind"] == "gemm" for t in res["tuned"])
