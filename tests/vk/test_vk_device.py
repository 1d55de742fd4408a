from __future__ import annotations

import json

import pytest
import vulkan

from pootvk.errors import DeviceNotFound
from pootvk.plan.profile import DeviceProfile, recorded_profile
from pootvk.vk import Device, clear_validation_messages, physical_devices, validation_messages


def test_physical_devices_lists_a_sane_profile() -> None:
    devs = physical_devices()
    assert devs
    for d in devs:
        p = d.profile
        assert d.device_type in ("discrete", "integrated", "virtual", "cpu", "other")
        assert p.max_workgroup_memory >= 16384
        assert min(p.max_grid) >= 65535
        assert p.max_invocations >= 128
        assert p.max_storage_buffer_range >= 1 << 27
        assert p.min_storage_offset_alignment & (p.min_storage_offset_alignment - 1) == 0
        assert p.subgroup_size >= 1 and p.timestamp_period_ns > 0
        assert DeviceProfile.from_json(p.to_json()) == p


def test_recorded_lavapipe_profile_matches_live() -> None:
    rec = recorded_profile("lavapipe")
    assert (rec.max_storage_buffer_range, rec.max_workgroup_memory) == (128 << 20, 32 << 10)
    live = [d for d in physical_devices() if "llvmpipe" in d.name.lower()]
    if not live:
        pytest.skip("no lavapipe (llvmpipe) device on this machine to compare with")
    assert live[0].device_type == "cpu"
    a, b = json.loads(live[0].profile.to_json()), json.loads(rec.to_json())
    for k in ("max_workgroup_memory", "max_grid", "max_storage_buffer_range",
              "min_storage_offset_alignment", "max_invocations"):
        assert a[k] == b[k], k


@pytest.mark.parametrize("selector", ["no-such-gpu", 99, "99"])
def test_device_not_found(selector) -> None:
    with pytest.raises(DeviceNotFound) as e:
        Device(selector)
    assert e.value.selector == selector
    assert e.value.available  # names what exists


def test_select_by_name_and_index_close_idempotent(device) -> None:
    word = device.name.split()[0]
    with Device(word.upper()) as d:
        assert d.name == device.name and d.profile == device.profile
    assert d.closed
    d.close()  # idempotent
    assert d.closed and d.live_objects() == 0
    idx = next(p.index for p in physical_devices() if p.name == device.name)
    d2 = Device(idx)
    b = d2.create_buffer(64, name="x")
    d2.close()  # destroys the buffer too
    assert b.destroyed and d2.live_objects() == 0


def test_validation_channel_reports_messages(device) -> None:
    from pootvk.vk import validation_active

    if not validation_active():
        pytest.skip("validation is off (POOTVK_VALIDATION=0)")
    info = vulkan.VkBufferCreateInfo(size=0, usage=vulkan.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)
    handle = None
    try:
        handle = vulkan.vkCreateBuffer(device.handle, info, None)
    except Exception:
        pass
    finally:
        if handle is not None:
            vulkan.vkDestroyBuffer(device.handle, handle, None)
    msgs = validation_messages()
    clear_validation_messages()
    assert any("VUID-VkBufferCreateInfo-size" in m for m in msgs), msgs
