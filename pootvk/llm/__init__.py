"""KV caches, the decode-loop driver, the Llama-shaped model and GGUF model files."""

from .decode_loop import DecodeLoop
from .gguf import GGUFFile, GGUFModel, load_gguf
from .model import LlamaConfig, LlamaModel, OracleLlama, random_weights, trace_llama
from .tokenizer import Tokenizer

__all__ = ["DecodeLoop", "GGUFFile", "GGUFModel", "LlamaConfig", "LlamaModel", "OracleLlama",
           "Tokenizer", "load_gguf", "random_weights", "trace_llama"]
