"""Which server a request goes to: consistent hashing for conversations, failover memory.

verl's server manager pins every turn of a conversation to one server, so that turn 2's prompt
(turn 1's prompt + answer + tool turn) finds its prefix in that server's KV/prefix cache. We do
the same with a hash ring: each URL owns many points ("virtual nodes") on a 64-bit circle and a
conversation key goes to the owner of the first point at or after its own hash. Adding or
removing one of N URLs moves only the keys of the arcs it gains or loses (~1/N of them); the
hash is blake2b, so the mapping is the same in every process and every run.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Iterable

ROUTINGS = ("sticky", "least_outstanding")
DEFAULT_ROUTING = "sticky"
VIRTUAL_NODES = 512  # 3 URLs: each gets within ~10 % of an even share of keys (256: up to ~24 %)


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def check_routing(routing: str) -> str:
    r = (routing or "").strip().lower().replace("-", "_")
    if r not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; choose one of {', '.join(ROUTINGS)}")
    return r


class HashRing:
    """Consistent hashing of keys onto ``nodes`` (server URLs), ``vnodes`` points per node."""

    def __init__(self, nodes: Iterable[str], vnodes: int = VIRTUAL_NODES) -> None:
        self.nodes = list(dict.fromkeys(nodes))
        if not self.nodes:
            raise ValueError("a hash ring needs at least one node")
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        self.vnodes = vnodes
        ring = sorted((_point(f"{node}#{i}"), node) for node in self.nodes for i in range(vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [n for _, n in ring]

    def node(self, key: str) -> str:
        """The node that owns ``key``."""
        i = bisect.bisect_left(self._points, _point(key))
        return self._owners[i % len(self._owners)]

    def preference(self, key: str) -> list[str]:
        """Every node once, in the order met walking the ring clockwise from ``key``: the owner
        first, then where the key goes when the ones before it fail."""
        start = bisect.bisect_left(self._points, _point(key))
        order: dict[str, None] = {}
        n = len(self._owners)
        for j in range(n):
            order.setdefault(self._owners[(start + j) % n], None)
            if len(order) == len(self.nodes):
                break
        return list(order)


class LRU:
    """A bounded mapping that forgets its least recently used entries (failover overrides)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, int(maxsize))
        self._d: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def set(self, key: str, value: str) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.maxsize:
            self._d.popitem(last=False)

    def pop(self, key: str) -> None:
        self._d.pop(key, None)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d
