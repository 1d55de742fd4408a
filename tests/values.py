"""Values of every dtype for primitive tests, running a graph on the device, and comparing
a device result with the oracle's within one 16-bit rounding."""

from __future__ import annotations

import numpy as np

from pootvk.ir import BF16, BOOL, F16, F32, I32, U32, DType, Graph, SlotKind
from pootvk.ir.dtypes import storage_values
from pootvk.plan import DeviceProfile, plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan

FLOATS = (F32, F16, BF16)
ALL = (F32, F16, BF16, I32, U32, BOOL)
#: the spacing of the 16-bit mantissas relative to a value: one rounding's worth
ULP = {F16: 2.0**-10, BF16: 2.0**-7}
#: below this the 16-bit types are subnormal (absolute, not relative, spacing)
TINY = {F16: 2.0**-24, BF16: 2.0**-126}


def values(shape: tuple[int, ...], dt: DType, rng: np.random.Generator,
           lo: float = -4.0, hi: float = 4.0) -> np.ndarray:
    """Random values as a ``dt`` slot holds them (16-bit ones already rounded)."""
    if dt is BOOL:
        return rng.random(shape) < 0.5
    if dt is I32:
        return rng.integers(int(lo) * 10, int(hi) * 10 + 1, shape).astype(np.int32)
    if dt is U32:
        return rng.integers(0, int(hi) * 20 + 1, shape).astype(np.uint32)
    return storage_values(rng.uniform(lo, hi, shape), dt)


def assert_matches(got: np.ndarray, want: np.ndarray, dt: DType, err_msg: str = "",
                   rtol32: float = 2e-6, atol32: float = 1e-6, roundings: int = 1) -> None:
    """Integers and Bool exactly; F32 to ``rtol32``/``atol32`` (transcendentals differ by
    an ulp or two between libm and the device); F16/BF16 within ``roundings`` 16-bit
    roundings of the oracle's value (both compute in F32 and round once per op, so they
    differ only where F32 results on either side of a rounding boundary)."""
    assert got.shape == want.shape, (got.shape, want.shape, err_msg)
    if dt is F32:
        np.testing.assert_allclose(got, want, rtol=rtol32, atol=atol32, err_msg=err_msg)
    elif dt.is_16bit:
        np.testing.assert_allclose(got, want, rtol=roundings * ULP[dt] + rtol32,
                                   atol=roundings * TINY[dt] + atol32, err_msg=err_msg)
    else:
        np.testing.assert_array_equal(got, want, err_msg=err_msg)


def run_on_device(device, g: Graph, ins: dict[str, np.ndarray],
                  profile: DeviceProfile | None = None) -> dict[str, np.ndarray]:
    """One step of ``g`` as it is (no compile passes) on ``device``; states bound first,
    their values after the step returned with the exports."""
    plan = plan_graph(g, profile or device.profile)
    with Replay(device, plan, compile_plan(plan)) as rp:
        for s in g.slots:
            if s.kind is SlotKind.STATE:
                rp.set_state(s.name, ins[s.name])
            elif s.kind is SlotKind.PARAM:
                rp.set_params({s.name: ins[s.name]})
        out = rp.step({k: v for k, v in ins.items() if g.slot(k).kind.per_step})
        out.update({name: rp.read_state(name) for name in g.states})
    return out


def ids(dt: DType) -> str:
    return dt.value
