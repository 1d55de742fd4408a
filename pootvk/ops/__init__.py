"""The tracer: builders that append primitive eqns (attention is a chain, not an opcode)."""

from .attention import (
    attention_core,
    attention_live,
    attention_masked,
    attention_prefill,
    causal_mask,
    repeat_kv,
    softmax,
    split_key,
    trace_attention,
    trace_decode_step,
)
from .builder import Builder
from .layers import rms_norm, rope, rope_tables
from .paged import paged_attention, paged_view, paged_write, trace_paged_step
from .sparse import (
    attention_block_sparse,
    block_summary_scores,
    block_topk,
    selected_attention,
    trace_block_sparse,
)

__all__ = [
    "Builder", "attention_block_sparse", "attention_core", "block_summary_scores",
    "block_topk", "selected_attention", "trace_block_sparse", "attention_live",
    "attention_masked", "attention_prefill",
    "causal_mask", "paged_attention", "paged_view", "paged_write", "repeat_kv", "rms_norm",
    "rope", "rope_tables", "softmax", "split_key", "trace_attention", "trace_decode_step",
    "trace_paged_step",
]
