"""KV caches and the decode-loop driver."""

from .decode_loop import DecodeLoop

__all__ = ["DecodeLoop"]
