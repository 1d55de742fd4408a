"""Planning for one device: rules, requests, schedules, buffer locations; no GLSL, no
handles."""

from . import fused, topk_rules  # noqa: F401  (register the fused and TopK rules)
from .bindings import Access, Binding, BufferRole, Scratch
from .decode_schedule import DecodeCombineRequest, DecodeProblem, DecodeRequest
from .matmul_schedule import (
    MatMulCombineRequest,
    MatMulKind,
    MatMulRequest,
    choose_matmul,
    forced_matmul,
)
from .planner import BoundOperand, BufferSpec, Kernel, Location, Plan, plan_graph
from .profile import DeviceProfile, recorded_profile, recorded_profiles
from .requests import (
    AttentionRequest,
    FusedReduceRequest,
    FusedRequest,
    FusedUpdateRequest,
    GroupRequest,
    LiteralOperand,
    PrimRequest,
    ReduceRequest,
    ScatterRequest,
    fold_grid,
)
from .rules import KernelCall, KernelRequest, PlanContext, RuleResult, plan_rules
from .schedule import ForcedSchedule, choose_lanes, current_forced, forced_schedule
from .selected import selected_schedule  # noqa: F401  (registers the SelectedAttention rule)

__all__ = [
    "DecodeCombineRequest", "DecodeProblem", "DecodeRequest", "ForcedSchedule",
    "current_forced", "forced_schedule",
    "MatMulCombineRequest", "MatMulKind", "MatMulRequest", "choose_matmul", "forced_matmul",
    "Access", "AttentionRequest", "Binding", "BoundOperand", "BufferRole", "BufferSpec",
    "DeviceProfile", "FusedReduceRequest", "FusedRequest", "FusedUpdateRequest", "GroupRequest",
    "Kernel",
    "KernelCall", "KernelRequest", "LiteralOperand", "Location",
    "Plan", "PlanContext", "PrimRequest", "ReduceRequest", "RuleResult", "ScatterRequest",
    "Scratch", "choose_lanes",
    "fold_grid", "plan_graph", "plan_rules", "recorded_profile", "recorded_profiles",
]
