import numpy as np

from pootvk import cli, devices


def test_devices_lists_the_default(capsys, device):
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert device.name in out
    assert any(d.name == device.name for d in devices())
    # whether the tensor-core decode kernel can run there, with the shapes it would use
    cm = device.profile.extra.get("coopmat")
    assert (f"cooperative matrices {'; '.join(cm)}" if cm else "no cooperative matrices") in out


def test_demo_checks_against_the_oracle(capsys, device):
    assert cli.main(["demo", "--steps", "40", "--capacity", "64"]) == 0
    out = capsys.readouterr()
    assert "40 steps, 1 recording" in out.out and ": OK" in out.out
    assert "attention fused: True" in out.out  # the chain became one Attention eqn
    assert "step 40/40" in out.err  # the progress line


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table in ``text``: (header cells, data rows' cells)."""
    tables, cur = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cur is None:
                cur = (cells, [])
                tables.append(cur)
            elif not set(line) <= set("|-"):
                cur[1].append(cells)
        else:
            cur = None
    return tables


def _is_ratio(header: str) -> bool:
    return "of ceiling" in header or " / " in header or " vs " in header


def test_bench_quick_prints_ratios_beside_every_time(capsys, device, tmp_path):
    import json

    out_json = tmp_path / "bench.json"
    assert cli.main(["bench", "--quick", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "read ceiling" in out and "## pootvk" in out and "## host overhead" in out
    tables = _tables(out)
    assert len(tables) >= 3
    for header, rows in tables:
        for i, h in enumerate(header):
            if not h.endswith(" us"):
                continue
            # a time column always has a ratio column beside it, and a measured time a ratio
            side = [j for j in (i - 1, i + 1) if 0 <= j < len(header) and _is_ratio(header[j])]
            assert side, (h, header)
            for r in rows:
                if r[i] not in ("", "n/a"):
                    float(r[i])
                    assert any(r[j] not in ("", "n/a") for j in side), (h, r)
    pv_header, pv_rows = tables[0]
    assert "of ceiling" in pv_header and "schedule" in pv_header and "splits" in pv_header
    f32 = [r for r in pv_rows if r[1] == "float32"]
    assert len(f32) == 2
    for r in f32:
        frac = float(r[pv_header.index("of ceiling")].rstrip("%"))
        assert 0 < frac and np.isfinite(frac)
        assert r[pv_header.index("check (nse)")].endswith("OK")
        assert r[pv_header.index("schedule")] in ("grouped", "streaming", "tensor cores, staged",
                                                  "tensor cores, register-fed")
    # 16-bit K/V: measured through the public path, or n/a with the reason
    for r in (r for r in pv_rows if r[1] == "float16"):
        assert r[4].startswith("n/a (") or float(r[4].rstrip("%")) > 0
    host = next(t for t in tables if t[0][0].startswith("decode step"))
    assert float(host[1][0][host[0].index("host / empty submit")].rstrip("x")) > 0
    data = json.loads(out_json.read_text())
    assert data["ceiling"]["gbps"] > 0 and data["host_overhead"]["empty_submit_us"] > 0
    assert {r["series"] for r in data["rows"]} >= {"pootvk"}


def test_bench_filters_shape_and_dtype(capsys, device):
    assert cli.main(["bench", "--quick", "--shape", "1,4,2,128,32", "--dtype", "f32",
                     "--reps", "3", "--warm", "0"]) == 0
    header, rows = _tables(capsys.readouterr().out)[0]
    assert [r[:2] for r in rows] == [["1,4,2,128,32", "float32"]]


def test_peer_fa_lines_are_parsed():
    from pootvk.benchmark import parse_peer_fa

    text = (
        "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,1],kv=32768,nb=1,mask=1,sinks=0,"
        "max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,"
        "permute=[0,1,2,3],kv_view=0,v_is_view_of_k=0):        1234 runs -    81.25 us/run - "
        "  1.07 GFLOP/run -  13.1 TFLOPS\n"
        "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=8,nr23=[4,32],kv=2048,nb=1,mask=1,prec=f32,"
        "type_KV=f32,permute=[0,1,2,3]):   99 runs -  140.50 us/run\n"
        "  FLASH_ATTN_EXT(hsk=64,hsv=64,nh=8,nr23=[8,1],kv=7680,nb=4,mask=1,prec=f32,"
        "type_K=f16,type_V=f16,permute=[0,1,2,3]):   9 runs -  1.5 us/run\n"
        "  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=32,nr23=[1,1],kv=32768,nb=1,type_K=q8_0,"
        "type_V=q8_0): not supported\n"
    )
    assert parse_peer_fa(text) == {((1, 32, 8, 32768, 128), "float16"): 81.25,
                                   ((32, 32, 8, 2048, 128), "float32"): 140.5}


def test_bad_bench_arguments_are_one_line_and_exit_2(capsys):
    import pytest

    for argv in (["bench", "--shape", "1,2,3"], ["bench", "--dtype", "int8"],
                 ["bench", "--reps", "0"], ["bench", "--warm", "-1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "error" in err, err


def test_debug_setting_logs_plan_and_sources(caplog, device, monkeypatch):
    import logging

    from pootvk import runtime
    from pootvk.config import Config
    from pootvk.ops import trace_decode_step

    monkeypatch.setattr(runtime, "config", lambda: Config(debug=2))
    with caplog.at_level(logging.INFO, logger="pootvk"):
        runtime.build_plan(trace_decode_step(1, 2, 2, 8, 4), device)
    text = caplog.text
    assert "plan for" in text and "#version 450" in text and "shared float s_m" in text


def test_python_dash_m_pootvk_lists_the_device(device):
    """``python -m pootvk devices`` works as a command and names the device we run on."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "pootvk", "devices"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"[{device.physical.index}] ")]
    assert len(lines) == 1 and device.name in lines[0], proc.stdout
    assert device.profile.device_type in lines[0] and device.profile.driver in lines[0]
