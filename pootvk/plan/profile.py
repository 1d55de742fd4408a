"""What the planner knows about a device: its limits, nothing else.

A profile comes from a live Vulkan device (``pootvk.vk`` queries it) or from a recorded
JSON file in ``profiles/``, so plans for devices that are not present can be made and
tested on any machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    vendor_id: int = 0
    device_type: str = "other"  # discrete | integrated | virtual | cpu | other
    driver: str = ""
    api_version: str = "1.3"
    max_workgroup_memory: int = 32768  # maxComputeSharedMemorySize, bytes
    max_grid: tuple[int, int, int] = (65535, 65535, 65535)  # maxComputeWorkGroupCount
    max_invocations: int = 1024  # maxComputeWorkGroupInvocations
    max_workgroup_size: tuple[int, int, int] = (1024, 1024, 64)
    max_storage_buffer_range: int = 1 << 27  # bytes one descriptor may bind
    max_allocation: int = 1 << 30  # maxMemoryAllocationSize, bytes
    min_storage_offset_alignment: int = 256  # minStorageBufferOffsetAlignment
    subgroup_size: int = 32
    #: subgroup basic + shuffle operations in compute shaders (VkPhysicalDeviceSubgroup-
    #: Properties); the grouped decode kernel reduces its dots with them, else through
    #: workgroup memory
    subgroup_shuffle: bool = False
    supports_16bit: bool = False
    compute_units: int | None = None  # when an extension exposes it (NV SM count, AMD CUs)
    timestamp_period_ns: float = 1.0
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def with_(self, **changes: object) -> DeviceProfile:
        """A copy with some limits changed (tests shrink limits to reach rare paths)."""
        return replace(self, **changes)

    def to_json(self) -> str:
        d = asdict(self)
        d["max_grid"] = list(self.max_grid)
        d["max_workgroup_size"] = list(self.max_workgroup_size)
        return json.dumps(d, indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> DeviceProfile:
        d = json.loads(text)
        d["max_grid"] = tuple(d["max_grid"])
        d["max_workgroup_size"] = tuple(d["max_workgroup_size"])
        return DeviceProfile(**d)


def recorded_profiles() -> dict[str, DeviceProfile]:
    """Every recorded profile shipped with pootvk, by file stem."""
    return {
        p.stem: DeviceProfile.from_json(p.read_text()) for p in sorted(PROFILE_DIR.glob("*.json"))
    }


def recorded_profile(stem: str) -> DeviceProfile:
    path = PROFILE_DIR / f"{stem}.json"
    if not path.exists():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
        raise KeyError(f"no recorded profile {stem!r}; known: {known}")
    return DeviceProfile.from_json(path.read_text())
