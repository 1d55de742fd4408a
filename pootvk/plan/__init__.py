"""Planning for one device: rules, requests, schedules, buffer locations; no GLSL, no
handles."""

from .bindings import Access, Binding, BufferRole, Scratch
from .planner import BoundOperand, BufferSpec, Kernel, Location, Plan, plan_graph
from .profile import DeviceProfile, recorded_profile, recorded_profiles
from .requests import AttentionRequest, KernelRequest, LiteralOperand, PrimRequest, fold_grid
from .rules import KernelCall, PlanContext, RuleResult, plan_rules
from .schedule import choose_lanes

__all__ = [
    "Access", "AttentionRequest", "Binding", "BoundOperand", "BufferRole", "BufferSpec",
    "DeviceProfile", "Kernel", "KernelCall", "KernelRequest", "LiteralOperand", "Location",
    "Plan", "PlanContext", "PrimRequest", "RuleResult", "Scratch", "choose_lanes",
    "fold_grid", "plan_graph", "plan_rules", "recorded_profile", "recorded_profiles",
]
