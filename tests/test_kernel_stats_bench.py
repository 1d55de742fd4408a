"""bench/kernel_stats.py --quick runs as the lead will run it on the GPU (here on lavapipe,
which lacks VK_KHR_pipeline_executable_properties: the table then keeps the GLSL line counts
and names the missing extension; on a driver with it every row carries statistics)."""

import json

from pootvk.vk.physical import PIPELINE_EXECUTABLE_EXT, pipeline_executable_info
from tests.helpers import load_bench


def test_kernel_stats_quick(capsys, device, tmp_path):
    mod = load_bench("kernel_stats")
    out_json = tmp_path / "stats.json"
    assert mod.main(["--quick", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    res = json.loads(out_json.read_text())
    rows = res["rows"]
    kernels = {r["kernel"] for r in rows}
    assert {"d64-f32 partial", "mla-small-f16 partial"} <= kernels
    assert any(k.startswith("mm M=1 ") for k in kernels)
    assert any(k.startswith("mm M=16 ") for k in kernels)
    assert any(r["kernel"].startswith("model") and r["variant"] == "attention" for r in rows)
    # the overrides reached the generated kernel (rows=2 lanes=8 is no profile's plan for
    # this shape; rows=1 is the H200's own, so there that row is the plan's)
    forced = [r for r in rows
              if r["kernel"] == "d64-f32 partial" and r["variant"] == "rows=2 lanes=8"]
    assert len(forced) == 1 and "rows=2 " in forced[0]["schedule"]
    assert all(r["glsl_lines"] > 10 for r in rows)
    p = device.physical
    if not pipeline_executable_info(p.handle, p.extensions):
        assert PIPELINE_EXECUTABLE_EXT in res["unavailable"]
        assert "no statistics: " in out
        assert all(r["stats"] == {} for r in rows)
    else:
        assert res["unavailable"] is None
        assert all(r["stats"] for r in rows)
    assert "| glsl " in out  # the table was printed
