"""CI guard: GPU tests must never be silently skipped on the wrong (or no) device."""

from __future__ import annotations

import os

from pootvk.config import config


def test_expected_device(device) -> None:
    want = os.environ.get("POOTVK_EXPECT_DEVICE")
    if want:
        assert want.lower() in device.name.lower(), (
            f"POOTVK_EXPECT_DEVICE={want!r} but the default device is {device.name!r}"
        )


def test_validation_active_when_requested(device) -> None:
    from pootvk.vk import validation_active

    if config().validation:
        assert validation_active(), "POOTVK_VALIDATION=1 but the validation layer is not active"
