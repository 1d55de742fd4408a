"""Shared test setup: every test runs under VK_LAYER_KHRONOS_validation and fails on any
validation message that arrived while it ran."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("POOTVK_VALIDATION", "1")  # before pootvk reads its config
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def device():  # type: ignore[no-untyped-def]
    """The process-wide default Device (lavapipe on CPU machines)."""
    from pootvk.vk import default_device

    return default_device()


@pytest.fixture(autouse=True)
def _no_validation_messages():  # type: ignore[no-untyped-def]
    """Clear the validation channel before each test; fail the test if it got a message.

    Only looks at the channel when pootvk.vk was imported, so tests that never touch
    Vulkan do not load the Vulkan loader.
    """
    vkmod = sys.modules.get("pootvk.vk.validation")
    if vkmod is not None:
        vkmod.clear_validation_messages()
    yield
    vkmod = sys.modules.get("pootvk.vk.validation")
    if vkmod is not None:
        msgs = vkmod.validation_messages()
        vkmod.clear_validation_messages()
        if msgs:
            for m in msgs:
                print("VALIDATION:", m)
            pytest.fail(f"{len(msgs)} Vulkan validation message(s):\n" + "\n".join(msgs))
