"""One radix tree over token prefixes, at page granularity, shared by every tier.

A node is one page. Its identity is the chained page hash of the whole prefix up to it (seeded with
the request namespace, so tenants never share tree nodes even where 0.5.14 shares L3 keys), which
makes a tree lookup a dict lookup per page. Each node records where its KV lives: a device page
(L1), a host page (L2, valid once the copy is acknowledged: `backed_up`), and whether its objects
were written to L3 (`stored`). Eviction is per tier, leaf-only, least recently used, as in SGLang:
a node leaves the device only when no child is on the device, and leaves the tree only when it is
on no tier and has no children.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator


class PageNode:
    __slots__ = (
        "key",
        "storage_key",
        "parent",
        "depth",
        "children",
        "device_page",
        "host_page",
        "backed_up",
        "stored",
        "hit_count",
        "last_access",
        "lock_ref",
        "host_ref",
        "device_children",
        "host_children",
    )

    def __init__(self, key: str, storage_key: str, parent: PageNode | None, depth: int):
        self.key = key
        self.storage_key = storage_key  # the L3 page key (version-specific)
        self.parent = parent
        self.depth = depth  # page index within its prompt
        self.children = 0
        self.device_page = -1
        self.host_page = -1
        self.backed_up = False  # host copy written and acknowledged
        self.stored = False  # L3 objects written and acknowledged
        self.hit_count = 0
        self.last_access = 0
        self.lock_ref = 0  # device pins (a request in flight)
        self.host_ref = 0  # host pins (a prefetch or load in flight)
        self.device_children = 0
        self.host_children = 0

    @property
    def on_device(self) -> bool:
        return self.device_page >= 0

    @property
    def on_host(self) -> bool:
        return self.host_page >= 0 and self.backed_up

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"PageNode({self.key[:8]}, dev={self.device_page}, host={self.host_page}, hits={self.hit_count})"


class PageTree:
    def __init__(self) -> None:
        self.nodes: dict[str, PageNode] = {}
        self._clock = itertools.count(1)
        self._seq = itertools.count()
        self._device_heap: list[tuple[int, int, PageNode]] = []
        self._host_heap: list[tuple[int, int, PageNode]] = []

    def __len__(self) -> int:
        return len(self.nodes)

    # -- lookup ---------------------------------------------------------------------------------

    def match(self, keys: list[str]) -> list[PageNode]:
        """The nodes of the longest prefix of `keys` present in the tree."""
        out = []
        nodes = self.nodes
        for key in keys:
            node = nodes.get(key)
            if node is None:
                break
            out.append(node)
        return out

    def touch(self, nodes: list[PageNode]) -> None:
        """Stamp a matched path, newest at the leaf: a cold history then drains from its tail."""
        base = next(self._clock)
        for i, node in enumerate(nodes):
            node.last_access = base + i
            self._offer(node)
        self._clock = itertools.count(base + len(nodes) + 1)

    # -- insertion ------------------------------------------------------------------------------

    def add(self, key: str, storage_key: str, parent: PageNode | None, depth: int) -> PageNode:
        node = PageNode(key, storage_key, parent, depth)
        node.last_access = next(self._clock)
        self.nodes[key] = node
        if parent is not None:
            parent.children += 1
        return node

    def get_or_add(self, key: str, storage_key: str, parent: PageNode | None, depth: int) -> PageNode:
        node = self.nodes.get(key)
        return node if node is not None else self.add(key, storage_key, parent, depth)

    # -- tier state changes keep the parents' child counts right ---------------------------------

    def set_device(self, node: PageNode, page: int) -> None:
        if node.device_page < 0 and node.parent is not None:
            node.parent.device_children += 1
        node.device_page = page
        self._offer(node)

    def clear_device(self, node: PageNode) -> int:
        page = node.device_page
        node.device_page = -1
        if node.parent is not None:
            node.parent.device_children -= 1
            self._offer(node.parent)
        self._offer(node)
        return page

    def set_host(self, node: PageNode, page: int) -> None:
        if node.host_page < 0 and node.parent is not None:
            node.parent.host_children += 1
        node.host_page = page
        node.backed_up = True
        self._offer(node)

    def clear_host(self, node: PageNode) -> int:
        page = node.host_page
        node.host_page = -1
        node.backed_up = False
        if node.parent is not None:
            node.parent.host_children -= 1
            self._offer(node.parent)
        return page

    def remove_if_unused(self, node: PageNode) -> bool:
        """Drop a node that lives on no tier and has no children."""
        if node.on_device or node.host_page >= 0 or node.children:
            return False
        del self.nodes[node.key]
        if node.parent is not None:
            node.parent.children -= 1
            self._offer(node.parent)
        return True

    # -- eviction candidates --------------------------------------------------------------------

    def _offer(self, node: PageNode) -> None:
        if node.on_device and node.device_children == 0:
            heapq.heappush(self._device_heap, (node.last_access, next(self._seq), node))
        if node.host_page >= 0 and node.host_children == 0:
            heapq.heappush(self._host_heap, (node.last_access, next(self._seq), node))

    def device_victims(self, can_evict: Callable[[PageNode], bool]) -> Iterator[PageNode]:
        """Device leaves in LRU order (a node may become a leaf while iterating)."""
        yield from self._victims(self._device_heap, lambda n: n.on_device and n.device_children == 0, can_evict)

    def host_victims(self, can_evict: Callable[[PageNode], bool]) -> Iterator[PageNode]:
        yield from self._victims(self._host_heap, lambda n: n.host_page >= 0 and n.host_children == 0, can_evict)

    def _victims(self, heap, is_leaf, can_evict) -> Iterator[PageNode]:
        skipped = []
        try:
            while heap:
                access, seq, node = heapq.heappop(heap)
                if access != node.last_access or self.nodes.get(node.key) is not node or not is_leaf(node):
                    continue  # stale entry
                if not can_evict(node):
                    skipped.append((access, seq, node))
                    continue
                yield node
        finally:
            for entry in skipped:  # pinned now, evictable later
                heapq.heappush(heap, entry)

    def clear(self) -> None:
        self.nodes.clear()
        self._device_heap.clear()
        self._host_heap.clear()
