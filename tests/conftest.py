"""Shared test setup: every test runs under VK_LAYER_KHRONOS_validation and fails on any
validation message that arrived while it ran."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("POOTVK_VALIDATION", "1")  # before pootvk reads its config
# Before numpy loads: OpenBLAS's worker threads spin against each other and lavapipe's on
# a 2-core machine; a 1-row matmul (the numpy Llama references' decode step) measured
# 4.5 ms with 2 threads under load and 0.14 ms with 1.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402


def _device_line() -> str:
    """The Vulkan device the suite runs on (the ``device`` fixture's), in one line."""
    from pootvk.config import config as pootvk_config

    try:
        from pootvk.vk import default_device, validation_active

        d = default_device()
        p = d.profile
        driver = f"{p.driver} {p.extra.get('driver_info', '')}".strip() or "driver unknown"
        return (
            f"vulkan device: [{d.physical.index}] {d.name} ({p.device_type}, {driver}, "
            f"Vulkan {p.api_version}); validation {'on' if validation_active() else 'off'}; "
            f"POOTVK_DEVICE={pootvk_config().device!r}, "
            f"POOTVK_EXPECT_DEVICE={os.environ.get('POOTVK_EXPECT_DEVICE')!r}"
        )
    except Exception as e:  # no device: say so; the device tests fail on their own
        return f"vulkan device: none ({type(e).__name__}: {e})"


def pytest_report_header(config):  # type: ignore[no-untyped-def]
    """Name the device in pytest's header, so a run's log always says where it ran."""
    return [_device_line()]


def pytest_sessionstart(session):  # type: ignore[no-untyped-def]
    """``-q`` (the project's addopts) hides the header: write the device line anyway."""
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and (not tr.showheader or tr.no_header):
        tr.write_line(_device_line())


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
