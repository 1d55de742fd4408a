import numpy as np

from pootvk import cli, devices


def test_devices_lists_the_default(capsys, device):
    assert cli.main(["devices"]) == 0
    assert device.name in capsys.readouterr().out
    assert any(d.name == device.name for d in devices())


def test_demo_checks_against_the_oracle(capsys, device):
    assert cli.main(["demo", "--steps", "40", "--capacity", "64"]) == 0
    out = capsys.readouterr()
    assert "40 steps, 1 recording" in out.out and ": OK" in out.out
    assert "step 40/40" in out.err  # the progress line


def test_bench_prints_ratios(capsys, device):
    assert cli.main(["bench", "--shape", "1,4,2,256,32"]) == 0
    out = capsys.readouterr().out
    assert "streaming-read ceiling" in out and "of ceiling" in out and "vs numpy" in out
    row = [r for r in out.splitlines() if r.startswith("| 1 | 4 |")][0]
    frac = float(row.split("|")[9].strip().rstrip("%"))
    assert 0 < frac and np.isfinite(frac)


def test_bad_bench_shape_is_refused():
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["bench", "--shape", "1,2,3"])


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
