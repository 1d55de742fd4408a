"""KV caches, the decode-loop driver and the Llama-shaped test model."""

from .decode_loop import DecodeLoop
from .model import LlamaConfig, LlamaModel, OracleLlama, random_weights, trace_llama

__all__ = ["DecodeLoop", "LlamaConfig", "LlamaModel", "OracleLlama", "random_weights",
           "trace_llama"]
