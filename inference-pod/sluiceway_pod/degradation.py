"""The degradation ladder's parts: a bounded LRU response cache with TTL, and the fallback slot.

Concurrency: both are owned by the event loop (no locks); the fallback model itself runs in a
worker thread, gated by a non-blocking permit count so it can never queue.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from .clock import Clock

V = TypeVar("V")


class ResponseCache(Generic[V]):
    """Exact-match cache keyed by (model, input hash). Bounded by ``max_entries``; entries expire
    ``ttl`` seconds after they were stored."""

    def __init__(self, max_entries: int, ttl: float, clock: Clock) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        stored, value = item
        if self._clock.now() - stored > self.ttl:
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    def put(self, key: str, value: V) -> None:
        self._data[key] = (self._clock.now(), value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class FallbackSlots:
    """How many fallback-model calls may run at once; ``try_take`` never waits."""

    permits: int
    in_use: int = 0

    def try_take(self) -> bool:
        if self.in_use >= self.permits:
            return False
        self.in_use += 1
        return True

    def give_back(self) -> None:
        self.in_use -= 1
