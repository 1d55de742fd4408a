"""One registrar for every stage's per-primitive rules.

Each stage keeps a ``RuleTable`` keyed by a primitive (a ``Prim`` object) or, for the
generators, by a request type: the shape rules (ir), the oracle (oracle), the plan rules
(plan) and the GLSL generators (shaders). Adding a primitive adds one entry per table; a
lookup that misses raises the stage's typed error naming the key, never a bare KeyError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
R = TypeVar("R")


class RuleTable(Generic[K, R]):
    """A registry ``key -> rule`` for one stage; ``missing(key)`` builds its typed error."""

    def __init__(self, stage: str, missing: Callable[[K, str], Exception]) -> None:
        self.stage = stage
        self._missing = missing
        self._rules: dict[K, R] = {}

    def register(self, *keys: K) -> Callable[[R], R]:
        """Decorator: ``rule`` serves every key given; registering a key twice is a bug."""

        def deco(rule: R) -> R:
            for k in keys:
                if k in self._rules:
                    raise RuntimeError(f"{self.stage} rule for {k} registered twice")
                self._rules[k] = rule
            return rule

        return deco

    def __getitem__(self, key: K) -> R:
        try:
            return self._rules[key]
        except KeyError:
            raise self._missing(key, f"no {self.stage} rule") from None

    def get(self, key: K) -> R | None:
        return self._rules.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._rules

    def __iter__(self) -> Iterator[K]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def missing_from(self, keys: Iterable[K]) -> list[K]:
        """The keys among ``keys`` with no rule here (tests check every stage covers all)."""
        return [k for k in keys if k not in self._rules]
