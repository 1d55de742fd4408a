"""Owned: the one base of every Vulkan object a Device owns (buffers, pipelines, recordings).

Why one base: each owner creates a few handles, must be counted for the leak test
(``Device.live_objects()``), registered with its Device so ``Device.close()`` can destroy it,
and destroyed exactly once, in the reverse order of the dependencies between its handles.
A subclass declares its handles in ``HANDLES`` (destruction order) and creates them in
``_create``; this class does the rest. Only this module (and the Device itself) touches the
Device's private ownership bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .device import Device


class Owned:
    """A set of Vulkan handles owned by one Device and destroyed together.

    Subclasses set their own fields, then call ``super().__init__(device)``, which runs
    ``_create(device.handle)``: a failure there destroys whatever was created and re-raises,
    so a half-built object never leaks or registers.
    """

    #: (attribute, vkDestroy*/vkFree* function) in destruction order.
    HANDLES: ClassVar[tuple[tuple[str, Callable[..., Any]], ...]] = ()
    #: Device.close() destroys lower ranks first (a recording before the pipelines and
    #: buffers it uses).
    CLOSE_RANK: ClassVar[int] = 0

    def __init__(self, device: Device) -> None:
        self.device = device
        for attr, _ in self.HANDLES:
            setattr(self, attr, None)
        try:
            self._create(device.handle)
        except BaseException:
            self._release()
            raise
        device._adopt(self)

    def _create(self, dev: Any) -> None:
        """Create the handles, storing each through :meth:`_own`."""
        raise NotImplementedError

    def _own(self, attr: str, handle: Any) -> Any:
        """Store a freshly created handle under ``attr`` and count it as live."""
        setattr(self, attr, handle)
        self.device._track(1)
        return handle

    def _before_release(self) -> None:
        """Work that must precede destroying the handles (unmap, wait for a fence)."""

    @property
    def destroyed(self) -> bool:
        return all(getattr(self, attr) is None for attr, _ in self.HANDLES)

    def _release(self) -> None:
        self._before_release()
        dev = self.device.handle
        for attr, destroy in self.HANDLES:
            h = getattr(self, attr)
            if h is not None:
                destroy(dev, h, None)
                setattr(self, attr, None)
                self.device._track(-1)

    def destroy(self) -> None:
        """Destroy every owned handle and leave the Device's care (idempotent). Nothing in
        flight may still use them (a Recording waits for its own submit first)."""
        if self.destroyed:
            return
        self._release()
        self.device._disown(self)
