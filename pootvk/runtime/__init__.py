"""Glue from a traced graph to a ready Replay: compile, plan, generate, record (cached).

Replays are cached per (device, plan key) so repeated calls with the same shapes reuse
their pipelines, buffers and recording instead of rebuilding them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable

from ..compile import compile_graph
from ..config import config
from ..ir import Graph
from ..plan import Plan, plan_graph
from ..shaders.generate import compile_plan
from ..vk import Device, default_device
from .replay import Replay

log = logging.getLogger("pootvk")
_devices: dict[object, Device] = {}
_replays: OrderedDict[tuple, Replay] = OrderedDict()
MAX_CACHED_REPLAYS = 16


def resolve_device(device: Device | int | str | None) -> Device:
    """None -> the default device; an index or name substring -> that device (kept open)."""
    if isinstance(device, Device):
        return device
    if device is None:
        return default_device()
    if device not in _devices:
        _devices[device] = Device(device)
    return _devices[device]


def build_plan(g: Graph, device: Device) -> Plan:
    """Compile and plan ``g``; POOTVK_DEBUG=1 logs the plan, 2 also every kernel's source."""
    plan = plan_graph(compile_graph(g), device.profile)
    level = config().debug
    if level >= 1:
        log.info("%s", plan)
    if level >= 2:
        from ..shaders.generate import generate

        for i, k in enumerate(plan.kernels):
            log.info("kernel k%d (%s):\n%s", i, k.label, generate(k.request))
    return plan


def build_replay(g: Graph, device: Device, *, timestamps: bool = False) -> Replay:
    """A new (uncached) Replay for ``g``: the caller owns it and closes it."""
    plan = build_plan(g, device)
    return Replay(device, plan, compile_plan(plan), timestamps=timestamps)


def cached_replay(key: Hashable, trace: Callable[[], Graph], device: Device) -> Replay:
    """The Replay for ``key`` on ``device``, built from ``trace()`` only on a miss.

    ``key`` must name everything the traced graph depends on (shapes, scale, softcap), so
    a hit skips tracing, compiling, planning and recording: the per-call cost is a lookup.
    """
    full = (id(device), key)
    rp = _replays.get(full)
    if rp is not None and rp.recording is not None and not device.closed:
        _replays.move_to_end(full)
        return rp
    plan = build_plan(trace(), device)
    rp = Replay(device, plan, compile_plan(plan))
    _replays[full] = rp
    while len(_replays) > MAX_CACHED_REPLAYS:
        _, old = _replays.popitem(last=False)
        old.close()
    return rp
