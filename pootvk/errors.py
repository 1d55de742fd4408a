"""Every typed error pootvk raises, in one place.

Each error carries the numbers that explain it as attributes *and* in its message, so a
user reading a traceback knows what to change without opening the source. A raise never
leaves a half-built plan, a half-written state or a published output behind: callers
raise before they mutate.
"""

from __future__ import annotations


class PootvkError(Exception):
    """Base of every pootvk error."""


# --- graph construction and binding -------------------------------------------------------


class ShapeError(PootvkError, ValueError):
    """An eqn's operands do not type under its primitive's rule."""


class BindError(PootvkError, ValueError):
    """A value bound to a graph input slot has the wrong shape or dtype."""

    def __init__(self, slot: str, expected: object, got: object, what: str = "shape") -> None:
        self.slot, self.expected, self.got, self.what = slot, expected, got, what
        super().__init__(f"slot {slot!r}: expected {what} {expected}, got {got}")


class SlotRangeError(PootvkError, ValueError):
    """A bound integer slot holds a word outside its declared range [lo, hi]."""

    def __init__(self, slot: str, value: int, lo: int, hi: int) -> None:
        self.slot, self.value, self.lo, self.hi = slot, value, lo, hi
        super().__init__(f"slot {slot!r}: value {value} outside declared range [{lo}, {hi}]")


class CapacityExceeded(PootvkError, ValueError):
    """A decode loop was asked to write past the KV cache's capacity."""

    def __init__(self, position: int, tokens: int, capacity: int) -> None:
        self.position, self.tokens, self.capacity = position, tokens, capacity
        super().__init__(
            f"writing {tokens} token(s) at position {position} needs {position + tokens} "
            f"slots; the cache holds {capacity}"
        )


# --- planning ------------------------------------------------------------------------------


class CapabilityError(PootvkError):
    """The device cannot run a plan that is otherwise well formed."""


class AttentionLds(CapabilityError):
    """Not even one lane's running state (dv + 2 floats) fits the workgroup memory."""

    def __init__(self, dv: int, need_bytes: int, device_bytes: int) -> None:
        self.dv, self.need_bytes, self.device_bytes = dv, need_bytes, device_bytes
        super().__init__(
            f"attention with value width dv={dv} needs {need_bytes} bytes of workgroup memory "
            f"for one lane; the device has {device_bytes}"
        )


class GridLimit(CapabilityError):
    """A launch needs more workgroups than even a 2-D grid of the device holds."""

    def __init__(self, groups: int, max_x: int, max_y: int) -> None:
        self.groups, self.max_x, self.max_y = groups, max_x, max_y
        super().__init__(
            f"{groups} workgroups exceed the device grid {max_x} x {max_y}"
        )


class BindingRange(CapabilityError):
    """One value is wider than the device's maxStorageBufferRange."""

    def __init__(self, name: str, nbytes: int, limit: int) -> None:
        self.name, self.nbytes, self.limit = name, nbytes, limit
        super().__init__(
            f"value {name} is {nbytes} bytes; the device binds at most {limit} bytes "
            f"(maxStorageBufferRange)"
        )


class ScratchBytes(CapabilityError):
    """A declared plan-local scratch cannot be allocated on the device."""

    def __init__(self, nbytes: int, limit: int) -> None:
        self.nbytes, self.limit = nbytes, limit
        super().__init__(f"scratch of {nbytes} bytes exceeds the device limit {limit}")


class UnsupportedPrimitive(CapabilityError):
    """No kernel generator exists for a primitive (or this form of it)."""

    def __init__(self, prim: str, why: str) -> None:
        self.prim, self.why = prim, why
        super().__init__(f"no kernel for {prim}: {why}")


class DtypeLowering(CapabilityError):
    """A dtype has no lowering on this target (the generated kernels are F32/I32)."""

    def __init__(self, prim: str, dtype: str, missing: str = "") -> None:
        self.prim, self.dtype, self.missing = prim, dtype, missing
        why = f": the device lacks {missing}" if missing else ""
        super().__init__(f"{prim} at dtype {dtype} has no SPIR-V lowering here{why}")


# --- shaders and Vulkan ---------------------------------------------------------------------


class ShaderCompileError(PootvkError):
    """glslang refused a generated source: a generator bug, reported with the log."""

    def __init__(self, log: str, source: str) -> None:
        self.log, self.source = log, source
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(source.splitlines()))
        super().__init__(f"glslang failed:\n{log}\n--- source ---\n{numbered}")


class VulkanError(PootvkError):
    """A Vulkan call failed, or no usable device/driver exists."""


#: What to do when the Vulkan loader finds no driver at all.
INSTALL_HINT = (
    "no Vulkan driver found: install Mesa's CPU driver lavapipe (apt-get install "
    "mesa-vulkan-drivers) or your GPU's Vulkan driver, and check VK_DRIVER_FILES / "
    "VK_ICD_FILENAMES if set"
)


class DeviceNotFound(VulkanError):
    """POOTVK_DEVICE (or device=) names no device on this machine, or there is no Vulkan
    driver at all (then the message says what to install)."""

    def __init__(self, selector: object, available: list[str], why: str = "") -> None:
        self.selector, self.available = selector, available
        if not available:
            msg = f"{INSTALL_HINT}" + (f" ({why})" if why else "")
        else:
            msg = f"no Vulkan device matches {selector!r}; available: {available}"
        super().__init__(msg)


class PipelineStatisticsUnavailable(CapabilityError):
    """Pipeline.statistics() cannot answer: the device lacks VK_KHR_pipeline_executable_
    properties (or its pipelineExecutableInfo feature), or the pipeline was created without
    capturing statistics (POOTVK_PIPELINE_STATS unset)."""

    def __init__(self, device: str, missing: list[str]) -> None:
        self.device, self.missing = device, list(missing)
        super().__init__(
            f"no pipeline statistics on {device!r}: missing {'; '.join(self.missing)}"
        )


class InvalidDevice(PootvkError, TypeError):
    """``device=`` is neither a Device, an index, a name substring nor None."""

    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(
            f"device={value!r} ({type(value).__name__}): expected a pootvk Device, a "
            "non-negative int index, a name substring (str) or None"
        )


class InvalidArgument(PootvkError, TypeError):
    """A public-API argument has a type or value pootvk cannot use (scale='x', dims=1.5)."""

    def __init__(self, name: str, expected: str, got: object) -> None:
        self.name, self.expected, self.got = name, expected, got
        super().__init__(f"{name}: expected {expected}, got {got!r} ({type(got).__name__})")


class Closed(PootvkError, RuntimeError):
    """An object was used after close() (or after its Device was closed)."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what} is closed; make a new one (or do not close it while in use)")


class DeviceTimeout(VulkanError):
    """A fence wait passed its limit: the work may still be running on the device."""

    def __init__(self, label: str, limit_s: float, still_running: bool = False) -> None:
        self.label, self.limit_s, self.still_running = label, limit_s, still_running
        what = ("is still running from a submit that timed out; refusing a new submit"
                if still_running else f"did not finish within {limit_s:g} s")
        super().__init__(
            f"recording {label!r} {what}; raise POOTVK_FENCE_TIMEOUT_S (now {limit_s:g} s) if "
            "the work is just slow, or make the step smaller"
        )


class CacheCorrupt(UserWarning):
    """A warning: a disk cache entry failed its check and was discarded (the file is named)."""


class InvalidBinding(PootvkError, ValueError):
    """A dispatch binds a range the device or the buffer cannot honour (misaligned offset,
    range past the buffer's end, empty range, wrong binding count, foreign object)."""

    def __init__(self, label: str, binding: int, why: str) -> None:
        self.label, self.binding, self.why = label, binding, why
        super().__init__(f"dispatch {label!r} binding {binding}: {why}")


class GuardFailed(PootvkError, ValueError):
    """An index guard's witness counted offending values after a step: nothing of the step
    is published (no output returned, state writes skipped). ``value`` is one of them."""

    def __init__(self, guard: str, value: int, count: int = 1,
                 lo: int | None = None, hi: int | None = None) -> None:
        self.guard, self.value, self.count, self.lo, self.hi = guard, value, count, lo, hi
        where = f" outside [{lo}, {hi}]" if lo is not None else ""
        super().__init__(
            f"index guard {guard!r} failed: {count} value(s){where}, e.g. {value}; "
            "nothing published (outputs not returned, state unchanged)"
        )


# --- model files (GGUF) --------------------------------------------------------------------


class ModelFileError(PootvkError, ValueError):
    """A model file pootvk cannot load; ``path`` names the file."""


class ModelNotFound(ModelFileError, FileNotFoundError):
    """``--model`` / ``load()`` named neither an existing file nor a known packaged model."""

    def __init__(self, name: str, known: list[str], why: str = "") -> None:
        self.name, self.known, self.why = name, known, why
        super().__init__(
            f"model {name!r}: no such file and not a packaged model (known: {known})"
            + (f"; {why}" if why else "")
        )


class UnsupportedModel(ModelFileError):
    """The file is a model pootvk does not run: another architecture, a tokenizer kind or
    a feature (RoPE scaling, partial rotary) it has no graph for. ``what`` is the metadata
    key, ``value`` its value in the file, ``supported`` what pootvk takes there."""

    def __init__(self, path: str, what: str, value: object, supported: list[str]) -> None:
        self.path, self.what, self.value, self.supported = path, what, value, supported
        super().__init__(f"{path}: {what} = {value!r} is not supported (pootvk runs "
                         f"{supported})")


class MissingTensor(ModelFileError):
    """A tensor the architecture needs is not in the file."""

    def __init__(self, path: str, tensor: str, count: int) -> None:
        self.path, self.tensor, self.count = path, tensor, count
        super().__init__(f"{path}: tensor {tensor!r} is missing (the file has {count} "
                         "tensors)")


class MissingMetadata(ModelFileError):
    """A metadata key the loader needs is not in the file."""

    def __init__(self, path: str, key: str) -> None:
        self.path, self.key = path, key
        super().__init__(f"{path}: metadata key {key!r} is missing")


class TensorTypeUnsupported(ModelFileError):
    """A tensor is stored in a ggml type the ``gguf`` reader cannot dequantize."""

    def __init__(self, path: str, tensor: str, ggml_type: str) -> None:
        self.path, self.tensor, self.ggml_type = path, tensor, ggml_type
        super().__init__(f"{path}: tensor {tensor!r} has type {ggml_type}, which the gguf "
                         "reader cannot dequantize")


class TensorShapeMismatch(ModelFileError):
    """A tensor's shape disagrees with the shape the metadata implies."""

    def __init__(self, path: str, tensor: str, expected: tuple[int, ...],
                 got: tuple[int, ...]) -> None:
        self.path, self.tensor, self.expected, self.got = path, tensor, expected, got
        super().__init__(f"{path}: tensor {tensor!r} has shape {got}; the metadata implies "
                         f"{expected}")


class PromptTooLong(PootvkError, ValueError):
    """A prompt (plus at least one generated token) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, context: int) -> None:
        self.prompt_tokens, self.context = prompt_tokens, context
        super().__init__(f"the prompt is {prompt_tokens} tokens; the context holds {context} "
                         f"(at most {context - 1} prompt tokens leave room for one more)")


# --- paged KV maps (issue 11: bind-time checks of the write map) ---------------------------


class WriteMapError(PootvkError, ValueError):
    """A paged write map (a WRITEMAP slot, bound only as a checked ``ForwardSlotMap``) names
    a slot outside the pool ``[0, pool_slots)`` other than ``-1`` ("write nothing"), or names
    one pool slot twice. ``index`` is the map position of the offending word, ``value`` the
    word; for a repeat, ``first`` is the position that named the slot before. Raised at bind,
    before anything is written or dispatched: the pools are unchanged."""

    def __init__(self, slot: str, index: int, value: int, pool_slots: int, why: str,
                 first: int | None = None) -> None:
        self.slot, self.index, self.value, self.pool_slots, self.why, self.first = (
            slot, index, value, pool_slots, why, first)
        super().__init__(f"write map {slot!r}: word {index} = {value}: {why} "
                         f"(pool of {pool_slots} slots; -1 writes nothing)")


# --- paged KV: the block pool and its slot maps (pootvk/llm/blocks.py) ---------------------


class PoolExhausted(PootvkError, RuntimeError):
    """The KV block pool cannot give ``wanted`` blocks: only ``free`` are allocatable
    (free plus evictable cached blocks) of ``total``. Nothing was allocated or evicted."""

    def __init__(self, wanted: int, free: int, total: int) -> None:
        self.wanted, self.free, self.total = wanted, free, total
        super().__init__(
            f"the KV pool cannot allocate {wanted} block(s): {free} free (evictable cached "
            f"blocks included) of {total}; finish or preempt a sequence, or make the pool larger"
        )


class SlotMapError(PootvkError, ValueError):
    """A slot map being built names a position its row's block table does not hold (a write
    position past the row's length, a row longer than the read map). ``index`` locates the
    entry of map ``name`` (a write map's flat index, a read map's row), ``value`` is the
    position or length. A bad slot word is ``WriteMapError`` / ``SlotRangeError``."""

    def __init__(self, name: str, index: int, value: int, why: str) -> None:
        self.name, self.index, self.value, self.why = name, index, value, why
        super().__init__(f"{name} map entry {index} = {value}: {why}")
