"""How a kernel uses one of its buffer bindings: one enum that the planner (a request's
bindings), the generators (readonly blocks) and the recorder (barriers only on hazards)
share. It sits below every stage so no stage imports another for it."""

from __future__ import annotations

import enum


class Access(enum.Flag):
    READ = 1
    WRITE = 2
    READ_WRITE = READ | WRITE

    @property
    def reads(self) -> bool:
        return bool(self & Access.READ)

    @property
    def writes(self) -> bool:
        return bool(self & Access.WRITE)
