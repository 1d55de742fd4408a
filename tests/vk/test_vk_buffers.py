from __future__ import annotations

import numpy as np
import pytest

from pootvk.vk import Device
from pootvk.vk.memory import HOST_CACHED, UNCACHED_READ_MAX


@pytest.mark.parametrize("host_visible", [True, False])
def test_round_trip(device, host_visible) -> None:
    b = device.create_buffer(1001, host_visible=host_visible, name="rt")
    try:
        assert b.size == 1004
        x = np.arange(250, dtype=np.float32)
        b.write(0, x)
        b.write(1000, b"\x01\x02\x03\x04")
        np.testing.assert_array_equal(b.read_array(0, (250,), np.float32), x)
        assert b.read(1000, 4) == b"\x01\x02\x03\x04"
        got = b.read_array(8, (2, 3), np.float32)
        assert got.shape == (2, 3) and got.flags.writeable
        np.testing.assert_array_equal(got.ravel(), x[2:8])
        b.zero()
        assert b.read(0, b.size) == bytes(b.size)
        with pytest.raises(ValueError):
            b.write(1001, b"abcd")
        with pytest.raises(ValueError):
            b.read(-4, 4)
    finally:
        b.destroy()
    b.destroy()  # idempotent
    assert b.destroyed


def test_staging_path() -> None:
    """Device-local memory that is not mapped (discrete GPUs) goes through staging copies;
    lavapipe maps everything, so force the staging path on a private device."""
    with Device() as d:
        d.allow_mapped_device_memory = False
        b = d.create_buffer(4096, name="staged")
        assert not b.mapped
        x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
        b.write(0, x)
        np.testing.assert_array_equal(b.read_array(0, 1024, np.float32), x)
        b.write(4, b"\xff" * 3)
        assert b.read(4, 4) == b"\xff\xff\xff" + x.tobytes()[7:8]
        b.zero()
        assert b.read(0, 4096) == bytes(4096)
        h = d.create_buffer(16, host_visible=True)
        assert h.mapped
    assert d.live_objects() == 0


def test_uncached_mapped_reads_go_through_staging(monkeypatch) -> None:
    """Device memory mapped through a window the CPU does not cache (a discrete GPU's
    ReBAR: ~26 MB/s of CPU reads on the H200) is read directly only up to
    UNCACHED_READ_MAX bytes, else through a staging copy; writes stay direct, and host
    memory (the staging buffer's own) is read directly at any size. lavapipe's memory is
    cached, so there the flag is cleared on a private device (a ReBAR window, the H200's,
    is uncached as it is) and the copies counted; then the flag is set to check that
    cached memory is read directly."""
    with Device() as d:
        b = d.create_buffer(4 * UNCACHED_READ_MAX, name="rebar")
        h = d.create_buffer(4 * UNCACHED_READ_MAX, host_visible=True, name="host")
        assert b.mapped and h.mapped
        flags = d.memory_types.flags
        own = flags[b.memory_type]
        flags[b.memory_type] = own & ~HOST_CACHED
        copies = []
        real = d._copy
        monkeypatch.setattr(d, "_copy", lambda *a: (copies.append(a[4]), real(*a)))
        try:
            x = np.random.default_rng(1).standard_normal(UNCACHED_READ_MAX).astype(np.float32)
            b.write(0, x)
            h.write(0, x)
            assert copies == []  # writes are direct
            assert b.read(8, UNCACHED_READ_MAX) == x.tobytes()[8:8 + UNCACHED_READ_MAX]
            assert copies == []  # a small read: direct
            np.testing.assert_array_equal(b.read_array(0, x.size, np.float32), x)
            assert copies == [x.nbytes]  # a large one: one staging copy of its bytes
            np.testing.assert_array_equal(h.read_array(0, x.size, np.float32), x)
            assert copies == [x.nbytes]  # host memory: direct at any size, cached or not
            flags[b.memory_type] = own | HOST_CACHED
            np.testing.assert_array_equal(b.read_array(0, x.size, np.float32), x)
            assert copies == [x.nbytes]  # cached memory: direct at any size
        finally:
            flags[b.memory_type] = own
        b.destroy()
        h.destroy()
    assert d.live_objects() == 0
