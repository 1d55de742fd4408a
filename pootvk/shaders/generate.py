"""One entry point from a kernel request to GLSL, and from a plan to SPIR-V modules.

Generators are found by request type in one table (``shaders.table.generators``). The
request is the cache key: equal requests (hashable, they name everything the source depends
on) share one SPIR-V module per process, and the device shares one pipeline per module, so a
second plan with the same shapes compiles nothing.
"""

from __future__ import annotations

from functools import lru_cache

from ..plan import KernelRequest, Plan
from . import (  # noqa: F401  (generators register)
    attention,
    attention_decode,
    fused,
    group,
    matmul,
    prims,
    reduce,
    scatter,
    topk,
)
from .compiler import compile_glsl
from .table import generators


def generate(req: KernelRequest) -> str:
    return generators[type(req)](req)


@lru_cache(maxsize=1024)
def spirv_for(req: KernelRequest) -> bytes:
    """SPIR-V for one request (memoised by the request; on disk by the source's hash)."""
    return compile_glsl(generate(req))


def compile_plan(plan: Plan) -> list[bytes]:
    """SPIR-V for every kernel of ``plan``, in order."""
    return [spirv_for(k.request) for k in plan.kernels]
