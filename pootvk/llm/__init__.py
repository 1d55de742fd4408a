"""KV caches, the decode-loop driver, the Llama model graphs, GGUF model files, the
tokenizer and text generation (``load``)."""

from .decode_loop import DecodeLoop
from .generate import TextModel, load
from .gguf import GGUFFile, GGUFModel, load_gguf
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
from .tokenizer import Tokenizer

__all__ = ["PREFILL_BUCKETS", "SMOLLM2_135M", "DecodeLoop", "GGUFFile", "GGUFModel",
           "LlamaConfig", "LlamaModel", "OracleLlama", "TextModel", "Tokenizer", "load",
           "load_gguf", "model_params", "prefill_chunks", "random_weights", "sample",
           "trace_llama", "trace_prefill"]
