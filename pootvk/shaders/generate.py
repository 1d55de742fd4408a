"""One entry point from a kernel request to GLSL, and from a plan to SPIR-V modules."""

from __future__ import annotations

from ..plan import AttentionRequest, KernelRequest, Plan, PrimRequest
from .attention import generate_attention
from .compiler import compile_glsl
from .prims import generate_prim


def generate(req: KernelRequest) -> str:
    if isinstance(req, AttentionRequest):
        return generate_attention(req)
    if isinstance(req, PrimRequest):
        return generate_prim(req)
    raise TypeError(f"no generator for {type(req).__name__}")


def compile_plan(plan: Plan) -> list[bytes]:
    """SPIR-V for every kernel of ``plan``, in order (equal requests compile once)."""
    cache: dict[KernelRequest, bytes] = {}
    out = []
    for k in plan.kernels:
        if k.request not in cache:
            cache[k.request] = compile_glsl(generate(k.request))
        out.append(cache[k.request])
    return out
