"""The registries: the one list of each kind of thing vapo-lab knows by name.

``components`` holds the seven VAPO components, ``presets`` the algorithm presets, and ``table1``
derives the paper's Table 1 rows and grid cells from those two; everything else reads these lists
rather than restating them. Tasks, benchmarks and launchers keep their registries beside their
code.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


def unknown_name_message(kind: str, name: str, valid: list[str]) -> str:
    """Returns a one-line message for an unknown name, listing the valid ones and the closest."""

    # CLIP_HIGHER and clip-higher are typos of clip_higher, not other names
    def norm(
        x: str,
    ) -> str:
        return x.lower().replace("-", "_")

    by_norm = {norm(v): v for v in valid}
    close = difflib.get_close_matches(norm(name), list(by_norm), n=1, cutoff=0.5)
    hint = f"; did you mean {by_norm[close[0]]}?" if close else ""
    return f"unknown {kind} {name!r}: valid names are {', '.join(valid)}{hint}"


class Registry(Generic[T]):
    """Entries by name, in registration order; a taken name raises, an unknown one is named with
    the valid ones and the closest (raised as ``error``)."""

    def __init__(
        self,
        kind: str,
        error: Callable[[str], Exception] = KeyError,
        check: Callable[[T], None] | None = None,
    ) -> None:
        self.kind, self._error, self._check = kind, error, check
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Returns ``item`` after adding it; a taken name or a malformed item raises ValueError."""
        if item.name in self._items:
            raise ValueError(f"{self.kind} {item.name!r} is already registered")
        if self._check is not None:
            self._check(item)
        self._items[item.name] = item
        return item

    def get(self, name: str) -> T:
        """Returns the entry called ``name``; raises ``error`` naming the valid ones."""
        try:
            return self._items[name]
        except KeyError:
            raise self._error(unknown_name_message(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        """Returns the registered names in registration order."""
        return list(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
