from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from pootvk.errors import ShaderCompileError
from pootvk.shaders import compiler
from pootvk.shaders.compiler import compile_glsl

ADD = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < b.length()) b[i] = a[i] * 2.0;
}
"""


def unique(src: str) -> str:
    return src + f"// {uuid.uuid4().hex}\n"


def test_compiles_and_passes_spirv_val(tmp_path) -> None:
    spv = compile_glsl(unique(ADD), cache_dir=tmp_path)
    assert spv[:4] == b"\x03\x02\x23\x07" and len(spv) % 4 == 0
    val = shutil.which("spirv-val")
    assert val, "spirv-val not found: apt-get install spirv-tools"
    path = tmp_path / "k.spv"
    path.write_bytes(spv)
    r = subprocess.run(
        [val, "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_glsl_raises_with_log(tmp_path) -> None:
    bad = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { undefined_thing = 1; }\n"
    with pytest.raises(ShaderCompileError) as e:
        compile_glsl(unique(bad), cache_dir=tmp_path)
    assert "undefined_thing" in e.value.log
    assert "undefined_thing" in e.value.source
    assert not list(tmp_path.glob("spirv/*.spv"))  # nothing cached for a failed compile
    assert compiler.cache_key(e.value.source) not in compiler._memory_cache


def test_cache_memory_and_disk(tmp_path) -> None:
    src = unique(ADD)
    before = compiler.glslang_calls
    first = compile_glsl(src, cache_dir=tmp_path)
    assert compiler.glslang_calls == before + 1
    files = list((tmp_path / "spirv").glob("*.spv"))
    assert [f.stem for f in files] == [compiler.cache_key(src)]
    assert compile_glsl(src, cache_dir=tmp_path) == first  # in-process hit
    compiler.clear_memory_cache()
    assert compile_glsl(src, cache_dir=tmp_path) == first  # on-disk hit
    assert compiler.glslang_calls == before + 1
    assert not list((tmp_path / "spirv").glob("*.tmp"))
