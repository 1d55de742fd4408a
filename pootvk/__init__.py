"""pootvk: a raw-Vulkan compute runtime for transformer attention over a KV cache.

    import pootvk
    out = pootvk.attention(q, k, v, mask=None, scale=None, softcap=None)
    loop = pootvk.llm.DecodeLoop(batch=1, q_heads=32, kv_heads=8, head_dim=128, capacity=4096)
    out = loop.step(q, k_new, v_new)
    program = pootvk.compile(builder.build())    # any traced graph (pootvk.ops.Builder)
    outs = program(x=x)                         # exports by name
"""

from . import errors, llm
from .api import attention, devices
from .runtime.program import Program
from .runtime.program import compile_program as compile  # noqa: A004 (the user-facing name)

__all__ = ["Program", "attention", "compile", "devices", "errors", "llm"]
__version__ = "0.1.0"
