"""bench/model_generate.py --quick runs as the lead will run it on the GPU (here on
lavapipe, a tiny random model): checked against the oracle first, every decode dispatch
counted in one kernel family, the families summing to the step's GPU time, decode timed in
level order and in the plan's order with each one's barrier count."""

import json

from tests.helpers import load_bench


def test_model_bench_quick(capsys, device, tmp_path):
    mod = load_bench("model_generate")
    out_json = tmp_path / "gen.json"
    assert mod.main(["--quick", "--orders", "level,program", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "check: 16-token prefill" in out and "torch: skipped" in out
    res = json.loads(out_json.read_text())
    assert res["check_nse"] <= 5e-4
    assert sum(res["plan"]["families"].values()) == res["plan"]["kernels"]
    assert res["plan"]["attention_kernels"] == res["config"]["layers"]
    assert res["prefill"]["tokens"] == 16 and res["prefill"]["tokens_per_s"] > 0
    barriers = res["plan"]["barriers"]
    assert 0 < barriers["level"] <= barriers["program"] < res["plan"]["kernels"]
    assert [r["order"] for r in res["decode"]] == ["level"] * 2 + ["program"] * 2
    assert all(r["barriers"] == barriers[r["order"]] for r in res["decode"])
    for row in res["decode"]:
        fam = sum(row["families_ms"].values())
        # per-dispatch medians: their sum is near the median step (a shared machine: loose)
        assert 0.3 * row["gpu_ms"] <= fam <= 1.5 * row["gpu_ms"], (fam, row["gpu_ms"])
        assert 0 < row["read_fraction"] < 1.5
