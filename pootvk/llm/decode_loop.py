"""A fixed-capacity KV-cache decode loop, recorded once and replayed every token."""

from __future__ import annotations

import numbers
import threading

import numpy as np

from ..errors import BindError, CapacityExceeded, Closed, InvalidArgument
from ..ir import BF16, F16, F32, Graph
from ..ops import trace_decode_step
from ..plan import Plan
from ..runtime import build_replay, resolve_device
from ..vk import Device

#: ``kv_dtype`` names: the KV cache (and the new rows written into it) stored at this width;
#: attention reads 16-bit caches directly and computes in F32
KV_DTYPES = {"float32": F32, "float16": F16, "bfloat16": BF16}


def _dim(name: str, x: object) -> object:
    """numpy integers are ints; anything else goes on to the tracer's own check."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    if x is None or isinstance(x, (bool, numbers.Number)):
        return x
    raise InvalidArgument(name, "a positive int", x)


class DecodeLoop:
    """One decode step per call: write k/v at the position, attend over the cache.

    The graph is traced once (DynamicUpdateSlice into the state caches, the attention chain),
    compiled to one Attention eqn, planned, and recorded into a single command buffer; every
    ``step`` only writes q, k_new, v_new and the position into mapped buffers and resubmits
    it, so ``recordings`` stays 1.

    ``live`` (the default) attends in the live form (``ops.attention_live`` with
    ``len = pos + 1``): the kernel visits the ``pos + 1`` written keys, so a step costs the
    sequence length, not the capacity, and no mask is built. ``live=False`` keeps the
    capacity form: a causal mask over every slot (Iota vs pos), built in the graph each step.

    Safe to share between threads: the position check, the step and the position increment
    happen under one lock (as do ``reset`` and reading the caches), so two threads never
    write the same position; they take positions in the order they get the lock.
    """

    def __init__(
        self,
        batch: int,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        device: Device | int | str | None = None,
        *,
        value_dim: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
        timestamps: bool = False,
        kv_dtype: str = "float32",
        live: bool = True,
    ) -> None:
        batch, q_heads, kv_heads, head_dim, capacity, value_dim = (
            _dim(n, x) for n, x in (("batch", batch), ("q_heads", q_heads),
                                    ("kv_heads", kv_heads), ("head_dim", head_dim),
                                    ("capacity", capacity), ("value_dim", value_dim))
        )
        if kv_dtype not in KV_DTYPES:
            raise InvalidArgument("kv_dtype", f"one of {sorted(KV_DTYPES)}", kv_dtype)
        self.kv_dtype = kv_dtype
        self.live = bool(live)
        self.device = resolve_device(device)  # a bad device= fails before tracing
        self.shape = (batch, q_heads, kv_heads, head_dim, value_dim or head_dim, capacity)
        self.graph: Graph = trace_decode_step(
            batch, q_heads, kv_heads, head_dim, capacity,
            value_dim=value_dim, softcap=softcap, scale=scale, kv_dtype=KV_DTYPES[kv_dtype],
            live=self.live,
        )
        self._replay = build_replay(self.graph, self.device, timestamps=timestamps)
        self._lock = threading.RLock()
        self.position = 0

    @property
    def plan(self) -> Plan:
        return self._replay.plan

    @property
    def capacity(self) -> int:
        return self.shape[5]

    @property
    def recordings(self) -> int:
        """Command-buffer recordings made so far (1: recorded once, replayed every step)."""
        return self._replay.recordings

    def _arg(self, name: str, x: object, heads: int, width: int) -> np.ndarray:
        b = self.shape[0]
        a = np.asarray(x)
        if a.shape == (b, heads, width):
            a = a[:, :, None, :]
        if a.shape != (b, heads, 1, width):
            raise BindError(name, (b, heads, 1, width), a.shape, "shape")
        return a

    def step(self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray) -> np.ndarray:
        """Append one token's k/v for every row and return attention out [B, Hq, 1, Dv]."""
        b, hq, hkv, dk, dv, cap = self.shape
        if self._replay.closed:
            raise Closed(f"DecodeLoop {self.shape}")
        values: dict[str, object] = {
            "q": self._arg("q", q, hq, dk),
            "k_new": self._arg("k_new", k_new, hkv, dk),
            "v_new": self._arg("v_new", v_new, hkv, dv),
        }
        with self._lock:  # check, step and increment: one position per caller
            if self._replay.closed:
                raise Closed(f"DecodeLoop {self.shape}")
            if self.position >= cap:
                raise CapacityExceeded(self.position, 1, cap)
            values["pos"] = np.int32(self.position)
            out = self._replay.step(values)["out"]
            self.position += 1
            return out

    def gpu_time_ns(self) -> float | None:
        """GPU time of the last step (with ``timestamps=True``)."""
        return self._replay.gpu_time_ns()

    def dispatch_times_ns(self) -> list[tuple[str, float]] | None:
        """(kernel label, device ns) of every dispatch of the last step (``timestamps=True``)."""
        return self._replay.dispatch_times_ns()

    @property
    def k_cache(self) -> np.ndarray:
        with self._lock:
            return self._replay.read_state("k_cache")

    @property
    def v_cache(self) -> np.ndarray:
        with self._lock:
            return self._replay.read_state("v_cache")

    def seek(self, position: int, k_cache: np.ndarray | None = None,
             v_cache: np.ndarray | None = None) -> None:
        """Continue at ``position`` (the next step writes there), optionally over given cache
        contents (e.g. a restored prefix; checked in full before anything is written)."""
        _, _, _, _, _, cap = self.shape
        if int(position) < 0:
            raise InvalidArgument("position", f"an int in [0, {cap}]", position)
        if int(position) > cap:
            raise CapacityExceeded(int(position), 0, cap)
        with self._lock:
            for name, arr in (("k_cache", k_cache), ("v_cache", v_cache)):
                if arr is not None:
                    self._replay.set_state(name, arr)
            self.position = int(position)

    def reset(self) -> None:
        """Start a new sequence: position 0, caches zeroed."""
        with self._lock:  # never between another thread's step and its increment
            for name in ("k_cache", "v_cache"):
                s = self.graph.slot(name)
                self._replay.set_state(name, np.zeros(s.var.shape, np.float32))
            self.position = 0

    def close(self) -> None:
        """Free the KV cache and the recording (also done when the loop is garbage-collected:
        its Replay has a finalizer)."""
        self._replay.close()

    def __enter__(self) -> DecodeLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
