"""Settings read once from the environment into explicit fields.

Nothing else in pootvk reads ``os.environ``: every stage takes a ``Config`` (or the
process-wide one from :func:`config`).

| variable            | field        | meaning                                              |
|---------------------|--------------|------------------------------------------------------|
| POOTVK_DEVICE       | device       | device index or name substring (default: best GPU)   |
| POOTVK_VALIDATION   | validation   | 1 = enable VK_LAYER_KHRONOS_validation               |
| POOTVK_CACHE_DIR    | cache_dir    | SPIR-V + pipeline cache folder (~/.cache/pootvk)    |
| POOTVK_DEBUG        | debug        | 0 quiet, 1 plan summaries, 2 + generated sources     |
| POOTVK_FENCE_TIMEOUT_S | fence_timeout_s | seconds a submit may run before DeviceTimeout (600) |
| POOTVK_CACHE_MAX_BYTES | cache_max_bytes | disk SPIR-V cache cap; oldest files go (256 MiB)   |
| POOTVK_PIPELINE_STATS | pipeline_stats | 1 = capture driver statistics of compute pipelines |
|                     |              | (registers, spills...; Pipeline.statistics())        |
| POOTVK_SHADER_CLOCK | shader_clock | 1 = enable VK_KHR_shader_clock where the device has it |
|                     |              | (clockARB / clockRealtimeEXT in probe kernels)       |
| POOTVK_PROGRAM_ORDER | program_order | 1 = record dispatches in the plan's order, not level |
|                     |              | by level (vk.hazards.level_order; for comparisons)   |
| POOTVK_GROUP_KERNELS | group_kernels | 0 = one launch per elementwise kernel, not one per  |
|                     |              | dependency level (plan.group; for comparisons)       |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Config:
    device: str | None = None
    validation: bool = False
    cache_dir: Path = Path.home() / ".cache" / "pootvk"
    debug: int = 0
    fence_timeout_s: float = 600.0
    cache_max_bytes: int = 256 << 20
    pipeline_stats: bool = False
    #: enable VK_KHR_shader_clock (bench/decode_timeline.py's per-workgroup timelines)
    shader_clock: bool = False
    program_order: bool = False
    #: microseconds a fence wait polls before it blocks (None: 2000 on a GPU, 0 on a CPU
    #: device, whose own threads need the cores); POOTVK_SPIN_US
    spin_us: float | None = None
    #: fold GEMV input producers into the GEMV (None: on a GPU, not on a CPU device);
    #: POOTVK_LINEAR_PROLOGUES=0/1
    linear_prologues: bool | None = None
    #: one launch for each dependency level's small elementwise kernels (plan.group)
    group_kernels: bool = True

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Config:
        env = dict(os.environ) if env is None else env
        cache_dir = env.get("POOTVK_CACHE_DIR")
        return Config(
            device=env.get("POOTVK_DEVICE") or None,
            validation=env.get("POOTVK_VALIDATION", "0") not in ("", "0", "false", "no"),
            cache_dir=Path(cache_dir) if cache_dir else Path.home() / ".cache" / "pootvk",
            debug=int(env.get("POOTVK_DEBUG", "0") or 0),
            fence_timeout_s=float(env.get("POOTVK_FENCE_TIMEOUT_S", "") or 600.0),
            cache_max_bytes=int(env.get("POOTVK_CACHE_MAX_BYTES", "") or 256 << 20),
            pipeline_stats=env.get("POOTVK_PIPELINE_STATS", "0") not in ("", "0", "false", "no"),
            shader_clock=env.get("POOTVK_SHADER_CLOCK", "0") not in ("", "0", "false", "no"),
            program_order=env.get("POOTVK_PROGRAM_ORDER", "0") not in ("", "0", "false", "no"),
            spin_us=float(env["POOTVK_SPIN_US"]) if env.get("POOTVK_SPIN_US") else None,
            linear_prologues=None if not env.get("POOTVK_LINEAR_PROLOGUES") else
            env["POOTVK_LINEAR_PROLOGUES"] not in ("0", "false", "no"),
            group_kernels=env.get("POOTVK_GROUP_KERNELS", "1") not in ("0", "false", "no"),
        )


@cache
def config() -> Config:
    """The process-wide configuration, read once on first use."""
    return Config.from_env()
