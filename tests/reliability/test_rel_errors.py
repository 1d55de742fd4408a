"""Item 7: errors that say what to do: no driver, bad device values, numpy integer
dimensions, CLI argument errors (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pootvk import cli
from pootvk.llm import DecodeLoop
from pootvk.ops import trace_decode_step

ROOT = Path(__file__).resolve().parents[2]


def test_no_driver_says_what_to_install(tmp_path) -> None:
    env = dict(os.environ, VK_DRIVER_FILES=str(tmp_path / "none.json"),
               VK_ICD_FILENAMES=str(tmp_path / "none.json"), POOTVK_VALIDATION="0")
    code = ("import numpy as np, pootvk\n"
            "from pootvk.errors import DeviceNotFound\n"
            "q = np.ones((1, 1, 1, 4), np.float32)\n"
            "try:\n    pootvk.attention(q, q, q)\n"
            "except DeviceNotFound as e:\n    print('OK', e)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK") and "mesa-vulkan-drivers" in r.stdout, r.stdout


def test_numpy_integer_dimensions_are_accepted(device) -> None:
    dims = [np.int64(x) for x in (1, 2, 1, 8, 16)]
    g = trace_decode_step(*dims)
    assert g.slot("k_cache").var.shape == (1, 1, 16, 8)
    with DecodeLoop(*dims, device=np.int32(0)) as loop:
        out = loop.step(*(np.ones((1, h, 1, 8), np.float32) for h in (2, 1, 1)))
        assert out.shape == (1, 2, 1, 8)


@pytest.mark.parametrize("argv", [
    ["demo", "--steps", "0"], ["demo", "--steps", "x"], ["demo", "--capacity", "-3"],
    ["bench", "--shape", "garbage"], ["bench", "--shape", "1,2,3"],
    ["bench", "--shape", "0,1,1,1,1"],
])
def test_cli_argument_errors_are_one_line_exit_2(argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err and "Traceback" not in err


def test_cli_bad_device_is_one_line_exit_2(capsys) -> None:
    assert cli.main(["demo", "--steps", "1", "--capacity", "4", "--device", "nosuchgpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "nosuchgpu" in err
