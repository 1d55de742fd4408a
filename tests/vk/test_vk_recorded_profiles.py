"""Kernels planned for recorded profiles whose limits lavapipe meets run on lavapipe against
the reference (issue 7): the Intel profile's shared-memory reduction and the 16 KiB mobile
part's smaller workgroups execute somewhere in CI, not only on paper."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.ops import trace_attention
from pootvk.passes import compile_graph
from pootvk.plan import DecodeRequest, forced_schedule, plan_graph, recorded_profile
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, reference_attention


def _runnable_on(profile, device):
    """The recorded profile with every limit clamped to what the device allows."""
    d = device.profile
    return profile.with_(
        max_workgroup_memory=min(profile.max_workgroup_memory, d.max_workgroup_memory),
        max_invocations=min(profile.max_invocations, d.max_invocations),
        max_storage_buffer_range=min(profile.max_storage_buffer_range,
                                     d.max_storage_buffer_range),
        min_storage_offset_alignment=max(profile.min_storage_offset_alignment,
                                         d.min_storage_offset_alignment),
        max_grid=tuple(min(a, b) for a, b in zip(profile.max_grid, d.max_grid, strict=True)),
        subgroup_size=d.subgroup_size if profile.subgroup_shuffle else profile.subgroup_size,
    )


@pytest.mark.parametrize("name", ["intel_arc_anv", "mobile_16k"])
@pytest.mark.parametrize("splits", [None, 7])
def test_recorded_profile_plans_run_on_lavapipe(device, name, splits):
    prof = _runnable_on(recorded_profile(name), device)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 8, 1, 64), dtype=np.float32)
    k = rng.standard_normal((2, 2, 333, 64), dtype=np.float32)
    v = rng.standard_normal((2, 2, 333, 64), dtype=np.float32)
    g = compile_graph(trace_attention(q.shape, k.shape, v.shape))
    with forced_schedule("grouped", splits=splits):
        plan = plan_graph(g, prof)
    req = plan.kernels[0].request
    assert isinstance(req, DecodeRequest)
    assert req.subgroup is False  # neither profile has subgroup shuffles: shared memory
    assert splits is None or req.splits == splits
    with Replay(device, plan, compile_plan(plan)) as rp:
        out = rp.step({"q": q, "k": k, "v": v})["out"]
    assert_close(out, reference_attention(q, k, v))
