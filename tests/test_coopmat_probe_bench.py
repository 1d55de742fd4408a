"""bench/coopmat_load_probe.py needs a device with VK_KHR_cooperative_matrix (the H200 ran
it); here every variant's source must compile with no private array, and a device without
the extension is refused with a clear line instead of a crash."""

from pootvk.shaders.compiler import compile_glsl
from tests.helpers import load_bench
from tests.shaders.test_attention_decode import PRIVATE_ARRAY


def test_probe_sources_compile():
    mod = load_bench("coopmat_load_probe")
    for wg, rows in ((128, 2048), (256, 2048), (128, 512)):
        srcs = [mod.global_src(wg, rows, u) for u in (1, 2, 4)]
        srcs += [mod.staged_src(wg, rows, pf) for pf in (False, True)]
        for src in srcs:
            assert not PRIVATE_ARRAY.search(src)
            assert compile_glsl(src)


def test_probe_refuses_a_device_without_cooperative_matrices(capsys, device):
    if device.profile.extra.get("coopmat"):
        return  # a device that has them runs the probe for real (bench, not CI)
    mod = load_bench("coopmat_load_probe")
    assert mod.main(["--mb", "1"]) == 2
    assert "VK_KHR_cooperative_matrix" in capsys.readouterr().out
