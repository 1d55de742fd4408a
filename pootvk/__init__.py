"""pootvk: a raw-Vulkan compute runtime for transformer attention over a KV cache.

    import pootvk
    out = pootvk.attention(q, k, v, mask=None, scale=None, softcap=None)
    loop = pootvk.llm.DecodeLoop(batch=1, q_heads=32, kv_heads=8, head_dim=128, capacity=4096)
    out = loop.step(q, k_new, v_new)
"""

from . import errors, llm
from .api import attention, devices

__all__ = ["attention", "devices", "errors", "llm"]
__version__ = "0.1.0"
