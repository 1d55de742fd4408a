"""The generator table: request type -> GLSL generator (one entry per kernel family)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedPrimitive
from ..ir import RuleTable

Generator = Callable[[Any], str]
generators: RuleTable[type, Generator] = RuleTable(
    "generator", lambda t, why: UnsupportedPrimitive(getattr(t, "__name__", str(t)), why)
)
