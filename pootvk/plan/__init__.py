"""Planning for one device: requests, schedules, buffer locations; no GLSL, no handles."""

from .planner import PRIM_KERNELS, BufferSpec, Kernel, Location, Plan, plan_graph
from .profile import DeviceProfile, recorded_profile, recorded_profiles
from .requests import AttentionRequest, KernelRequest, LiteralOperand, PrimRequest, fold_grid
from .schedule import choose_lanes

__all__ = [
    "PRIM_KERNELS", "AttentionRequest", "BufferSpec", "DeviceProfile", "Kernel",
    "KernelRequest", "LiteralOperand", "Location", "Plan", "PrimRequest", "choose_lanes",
    "fold_grid", "plan_graph", "recorded_profile", "recorded_profiles",
]
