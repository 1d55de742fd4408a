"""Glue from a traced graph to a ready Replay: compile, plan, generate, record (cached).

Replays are cached per (device, plan key) so repeated calls with the same shapes reuse
their pipelines, buffers and recording instead of rebuilding them. The cache is an LRU of
``MAX_CACHED_REPLAYS``; a caller holds its replay (:func:`held_replay`) while it runs, and
an evicted replay is closed only when its last holder lets go.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from ..config import Config, config
from ..ir import Graph
from ..passes import compile_graph
from ..plan import DeviceProfile, Plan, plan_graph
from ..shaders.generate import compile_plan
from ..vk import Device, Timestamps, shared_device
from .replay import Replay

log = logging.getLogger("pootvk")
_replays: OrderedDict[tuple, Replay] = OrderedDict()
_lock = threading.RLock()
_holders: dict[int, int] = {}  # id(replay) -> callers running it now
_retired: dict[int, Replay] = {}  # evicted while held: closed by the last holder
MAX_CACHED_REPLAYS = 16


def resolve_device(device: Device | int | str | None) -> Device:
    """None -> the default device; an index or name substring -> that device (kept open).

    One Device per physical device: ``0``, ``"0"``, ``"llvm"`` and the default give the same
    object when they name the same physical device. Other types raise InvalidDevice.
    """
    if isinstance(device, Device):
        return device
    return shared_device(device)


def linear_prologues(profile: DeviceProfile, cfg: Config | None = None) -> bool:
    """Whether GEMV input producers fold into the GEMV (``passes.linear_fuse`` prologues):
    POOTVK_LINEAR_PROLOGUES when set, else on a GPU only. Every GEMV workgroup recomputes
    its prologue (an RMSNorm row's sum of squares, SwiGLU's exp) for the rows it reads: a GPU
    hides that in the kernel's latency and saves a dependent dispatch, a CPU device pays it
    in cycles (lavapipe, SmolLM2 shapes, 2 layers + LM head: one decode step 88.6 ms with
    prologues, 32.3 ms without, 37.6 ms with no Linear fusion at all)."""
    choice = (cfg or config()).linear_prologues
    return choice if choice is not None else profile.device_type != "cpu"


def build_plan(g: Graph, device: Device) -> Plan:
    """Compile and plan ``g``; POOTVK_DEBUG=1 logs the plan, 2 also every kernel's source."""
    pro = linear_prologues(device.profile, device.config)
    plan = plan_graph(compile_graph(g, linear_prologues=pro), device.profile,
                      group=device.config.group_kernels)
    level = config().debug
    if level >= 1:
        log.info("%s", plan)
    if level >= 2:
        from ..shaders.generate import generate

        for i, k in enumerate(plan.kernels):
            log.info("kernel k%d (%s):\n%s", i, k.label, generate(k.request))
    return plan


def build_replay(g: Graph, device: Device, *, timestamps: Timestamps = False,
                 share: Replay | None = None) -> Replay:
    """A new (uncached) Replay for ``g``: the caller owns it and closes it. With ``share``
    it binds that Replay's param and state buffers of the same slots (``Replay._borrow``)."""
    plan = build_plan(g, device)
    return Replay(device, plan, compile_plan(plan), timestamps=timestamps, share=share)


def _acquire(key: Hashable, trace: Callable[[], Graph], device: Device, hold: bool) -> Replay:
    full = (id(device), key)
    with _lock:
        rp = _replays.get(full)
        if rp is not None and not rp.closed and not device.closed:
            _replays.move_to_end(full)
            if hold:
                _holders[id(rp)] = _holders.get(id(rp), 0) + 1
            return rp
    plan = build_plan(trace(), device)  # outside the lock: other shapes keep running
    new = Replay(device, plan, compile_plan(plan))
    with _lock:
        rp = _replays.get(full)
        if rp is not None and not rp.closed:  # another thread built it meanwhile
            _replays.move_to_end(full)
            new.close()
        else:
            rp = _replays[full] = new
        if hold:
            _holders[id(rp)] = _holders.get(id(rp), 0) + 1
        while len(_replays) > MAX_CACHED_REPLAYS:
            _, old = _replays.popitem(last=False)
            if _holders.get(id(old), 0):
                _retired[id(old)] = old  # in use: the last holder closes it
            else:
                old.close()
    return rp


def _release(rp: Replay) -> None:
    with _lock:
        n = _holders.get(id(rp), 0) - 1
        if n > 0:
            _holders[id(rp)] = n
            return
        _holders.pop(id(rp), None)
        old = _retired.pop(id(rp), None)
    if old is not None:
        old.close()


@contextmanager
def held_replay(key: Hashable, trace: Callable[[], Graph], device: Device) -> Iterator[Replay]:
    """The cached Replay for ``key``, held (never closed by an eviction) inside the block.

    ``key`` must name everything the traced graph depends on (shapes, scale, softcap), so
    a hit skips tracing, compiling, planning and recording: the per-call cost is a lookup.
    """
    rp = _acquire(key, trace, device, hold=True)
    try:
        yield rp
    finally:
        _release(rp)


def cached_replay(key: Hashable, trace: Callable[[], Graph], device: Device) -> Replay:
    """The Replay for ``key`` on ``device``, built from ``trace()`` only on a miss, not held:
    another thread's eviction may close it (use :func:`held_replay` from threads)."""
    return _acquire(key, trace, device, hold=False)
