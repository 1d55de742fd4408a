"""KV caches (the paged cache's blocks and prefix cache: ``blocks``, ``prefix_cache``), the
decode-loop driver, the Llama model graphs (fixed-capacity and paged), the batched engine,
GGUF model files, the tokenizer and text generation (``load``; several prompts at once:
``load_engine``)."""

from .blocks import BLOCK_SIZE, BlockPool, BlockTable, check_write_map, read_map, write_map
from .decode_loop import DecodeLoop
from .engine import Engine
from .generate import TextEngine, TextModel, load, load_engine
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
from .paged_model import trace_llama_paged
from .prefix_cache import PrefixCache, WeightsIdentity
from .sampling import sample
from .tokenizer import Tokenizer

__all__ = ["BLOCK_SIZE", "PREFILL_BUCKETS", "SMOLLM2_135M", "BlockPool", "BlockTable",
           "DecodeLoop", "Engine", "GGUFFile", "GGUFModel", "LlamaConfig", "LlamaModel",
           "OracleLlama", "PrefixCache", "TextEngine", "TextModel", "Tokenizer",
           "WeightsIdentity", "check_write_map", "load", "load_engine", "load_gguf",
           "model_params", "prefill_chunks", "random_weights", "read_map", "sample",
           "trace_llama", "trace_llama_paged", "trace_prefill", "write_map"]
