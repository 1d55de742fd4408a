"""KV caches, the decode-loop driver, the Llama model graphs and text generation."""

from .decode_loop import DecodeLoop
from .generate import TextModel, load
from .model import (
    PREFILL_BUCKETS,
    SMOLLM2_135M,
    LlamaConfig,
    LlamaModel,
    OracleLlama,
    model_params,
    prefill_chunks,
    random_weights,
    trace_llama,
    trace_prefill,
)
from .sampling import sample

__all__ = ["PREFILL_BUCKETS", "SMOLLM2_135M", "DecodeLoop", "LlamaConfig", "LlamaModel", "OracleLlama",
           "TextModel", "load", "model_params", "prefill_chunks", "random_weights", "sample",
           "trace_llama", "trace_prefill"]
