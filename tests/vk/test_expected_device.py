"""CI guard: GPU tests must never run silently on the wrong (or no) device.

The default device is recomputed here from the documented rule (README, ``Device``):
POOTVK_DEVICE (an index or a case-insensitive name substring) when set, else the first
discrete GPU, then integrated, virtual, cpu, in enumeration order. POOTVK_EXPECT_DEVICE
(CI sets ``llvmpipe``) additionally names the device this run must be on, and
POOTVK_EXPECT_DRIVER the driver version (CI runs the suite on Mesa 22.3 and Mesa 25.0).
"""

from __future__ import annotations

import os

from pootvk.config import config
from pootvk.vk import physical_devices

PREFERENCE = ("discrete", "integrated", "virtual", "cpu")


def documented_choice(devices, selector):
    """The device the README's selection rule picks, written without ``vk.select``."""
    if selector is not None:
        if selector.strip().isdigit():
            return devices[int(selector)]
        return next(d for d in devices if selector.lower() in d.name.lower())
    for kind in PREFERENCE:
        for d in devices:
            if d.device_type == kind:
                return d
    return devices[0]


def test_default_device_is_the_documented_choice_and_the_expected_one(device) -> None:
    devices = physical_devices()
    assert devices, "no Vulkan device: the GPU tests cannot run"
    assert config().device == (os.environ.get("POOTVK_DEVICE") or None)
    want = documented_choice(devices, config().device)
    assert (device.physical.index, device.name) == (want.index, want.name), (
        f"default device {device.name!r}; the documented rule picks {want.name!r} from "
        f"{[(d.name, d.device_type) for d in devices]}"
    )
    expect = os.environ.get("POOTVK_EXPECT_DEVICE")
    if expect:
        assert expect.lower() in device.name.lower(), (
            f"POOTVK_EXPECT_DEVICE={expect!r} but the default device is {device.name!r}"
        )
    driver = os.environ.get("POOTVK_EXPECT_DRIVER")  # CI's driver matrix: "Mesa 25.0"
    if driver:
        info = str(device.profile.extra.get("driver_info", ""))
        assert driver.lower() in info.lower(), (
            f"POOTVK_EXPECT_DRIVER={driver!r} but {device.name!r} runs driver {info!r}"
        )


def test_validation_is_on_exactly_when_requested(device) -> None:
    from pootvk.vk import validation_active

    assert validation_active() == config().validation, (
        f"POOTVK_VALIDATION={os.environ.get('POOTVK_VALIDATION')!r} but the validation "
        f"layer is {'active' if validation_active() else 'not active'}"
    )
