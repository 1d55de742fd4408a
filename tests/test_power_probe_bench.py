"""bench/power_probe.py runs on the CI device (no NVML, no torch there): every case is run
back to back and timed per launch; the table and the JSON carry one row per case."""

import json

from tests.helpers import load_bench


def test_power_probe_quick(tmp_path, capsys, device):
    out = tmp_path / "p.json"
    rc = load_bench("power_probe").main(["--shape", "1,8,2,300,64", "--dtype", "float16",
                                         "--dtype", "float32", "--seconds", "0.2",
                                         "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "| 1,8,2,300,64 | float16 | pootvk | " in text
    rows = json.loads(out.read_text())["rows"]
    pv = [r for r in rows if r["runner"] == "pootvk"]
    assert [r["dtype"] for r in pv] == ["float16", "float32"]
    assert all(0 < r["us_per_launch"] < 2e5 for r in pv)
    # NVML only where pynvml imports and sees the device; then every sample field is set
    assert all((r["watts"] is None) == (r["sm_mhz"] is None) for r in rows)
