"""A radix tree over token prefixes like SGLang's: a node is a run of whole pages, shared by every tier.

A node holds consecutive pages of a prompt (their tree keys, L3 keys, and device and host page
indices). It is split where two prompts diverge (a match or an insert that stops inside it) and
otherwise lives and leaves a tier whole, as SGLang's radix nodes do (docs/controller.md#device-eviction).
A node's page keys are chained hashes of the whole prefix (seeded with the request namespace), so
two runs that agree on a page agree on every page before it: a child is found by its first page
key, and a run matches up to the first page where the keys differ.

Tier state per node: `device` (L1 page indices, or None once evicted), `host` (L2 page indices,
set once the copy is acknowledged, or None) and `stored` (how many leading pages were written to
L3). Eviction candidates are kept as SGLang keeps them: device leaves (on device, unlocked, no
child on device) and host leaves (off device, backed up, unlocked, no pinned transfer, and by
version no backed-up child (0.5.14) or no child at all (0.5.23); docs/controller.md#host-eviction).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any, cast

from hicache_ops.sglang.versions import V0_5_14

# Node.heaped bits: which of the tree's lazy eviction heaps hold an entry for the node.
DEVICE_HEAP = 1
HOST_HEAP = 2


class Node:
    __slots__ = (
        "id",
        "keys",
        "storage_keys",
        "depth",
        "parent",
        "children",
        "device",
        "host",
        "stored",
        "hit_count",
        "last_access",
        "lock_ref",
        "host_ref",
        "device_children",
        "host_children",
        "heaped",
    )

    def __init__(self, node_id: int, keys: list[str], storage_keys: list[str], depth: int, parent: Node | None):
        self.id = node_id
        self.keys = keys
        self.storage_keys = storage_keys
        self.depth = depth  # page index of the node's first page within its prompt
        # The root's is None and never read (the root is never refreshed, split, dropped or
        # deleted); every other node's is a node.
        self.parent: Node = cast(Node, parent)
        self.children: dict[str, Node] = {}
        self.device: list[int] | None = None
        self.host: list[int] | None = None
        self.stored = 0  # leading pages whose L3 objects were written and acknowledged
        self.hit_count = 0
        self.last_access = 0
        self.lock_ref = 0  # running requests holding the node on the device
        self.host_ref = 0  # transfers in flight reading the node's host pages
        self.device_children = 0
        self.host_children = 0
        # Bits: the node has an entry in the tree's device heap (1), host heap (2); at most one each.
        self.heaped = 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Node({self.id}, pages={len(self.keys)}, depth={self.depth}, device={self.device is not None}, "
            f"host={self.host is not None}, hits={self.hit_count})"
        )


class PageView:
    """One page of a node, for observers (trace) that reason page by page."""

    __slots__ = ("node", "index")

    def __init__(self, node: Node, index: int):
        self.node = node
        self.index = index

    @property
    def key(self) -> str:
        return self.node.keys[self.index]

    @property
    def storage_key(self) -> str:
        return self.node.storage_keys[self.index]

    @property
    def depth(self) -> int:
        return self.node.depth + self.index

    @property
    def device_page(self) -> int:
        return self.node.device[self.index] if self.node.device is not None else -1

    @property
    def host_page(self) -> int:
        return self.node.host[self.index] if self.node.host is not None else -1

    @property
    def backed_up(self) -> bool:
        return self.node.host is not None

    @property
    def stored(self) -> bool:
        return self.index < self.node.stored

    @property
    def hit_count(self) -> int:
        return self.node.hit_count


def page_views(nodes: list[Node]) -> list[PageView]:
    return [PageView(node, i) for node in nodes for i in range(len(node.keys))]


def _common_pages(run: list[str], keys: list[str], start: int) -> int:
    """Leading pages of `run` equal to keys[start:]. Chained keys agree on a prefix and differ after
    it, so the boundary is found by bisection."""
    n = min(len(run), len(keys) - start)
    if n and run[n - 1] == keys[start + n - 1]:
        return n
    lo, hi = 0, n  # run[:lo] matches; run[hi - 1] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run[mid - 1] == keys[start + mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


EVICTION_PRIORITY: dict[str, Callable[[Node], tuple[Any, ...]]] = {
    # docs/controller.md#eviction-policies; the node id breaks ties the same way every run.
    # A heap entry: the priority's fields, then the node (never compared: ids are unique). Flat,
    # so the heap compares plain ints rather than a nested tuple.
    "lru": lambda node: (node.last_access, node.id, node),
    "lfu": lambda node: (node.hit_count, node.last_access, node.id, node),
}


class RadixTree:
    def __init__(self, version: str, eviction_policy: str = "lru"):
        self.version = version
        self.priority = EVICTION_PRIORITY[eviction_policy]
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.root = Node(0, [], [], 0, None)
        self.root.device = []
        self.root.host = []
        self.root.lock_ref = 1  # never evicted
        self.device_leaves: set[Node] = set()
        self.host_leaves: set[Node] = set()
        # Lazy heaps over the candidate sets, kept across eviction calls: (*priority, node) pushed
        # when a node becomes a candidate. A node's priority only grows (stamps and hit counts
        # increase), so an entry is at most its node's priority: a popped entry that is stale is
        # pushed again with the current one, and one whose node left the set is dropped. A node has
        # at most one entry per heap (Node.heaped): one left behind when it leaves a set still
        # serves when it rejoins. Either way the pop is the member first in policy order.
        self._device_heap: list[tuple[Any, ...]] = []
        self._host_heap: list[tuple[Any, ...]] = []
        # Nodes with both a device and a host copy, in the order they became so (write_back reclaim).
        self.duplicates: dict[int, Node] = {}
        # Device pages of locked nodes: what running requests hold (the rest is free or evictable).
        self.protected_pages = 0
        self._childless_host_leaves = self.version != V0_5_14

    # -- bookkeeping ----------------------------------------------------------------------------

    def _refresh(self, node: Node) -> None:
        """Put `node` in or out of the eviction candidate sets after a change to it or its children."""
        if node is self.root:
            return
        # Hot (several calls per request): one branch on the device copy, then the two tests.
        if node.device is not None:
            self.host_leaves.discard(node)
            leaves = self.device_leaves
            if node.lock_ref or node.device_children:
                leaves.discard(node)
            elif node not in leaves:
                leaves.add(node)
                if not node.heaped & DEVICE_HEAP:
                    node.heaped |= DEVICE_HEAP
                    heappush(self._device_heap, self.priority(node))
            return
        self.device_leaves.discard(node)
        leaves = self.host_leaves
        if (
            node.host is None
            or node.lock_ref
            or node.host_ref
            or (node.children if self._childless_host_leaves else node.host_children)
        ):
            leaves.discard(node)
        elif node not in leaves:
            leaves.add(node)
            if not node.heaped & HOST_HEAP:
                node.heaped |= HOST_HEAP
                heappush(self._host_heap, self.priority(node))

    def touch(self, nodes: list[Node]) -> None:
        """Stamp an access, root to leaf: a branch's leaf is always its newest node."""
        clock = self._clock
        for node in nodes:
            node.last_access = next(clock)

    def lock(self, nodes: list[Node]) -> None:
        """Lock each node and its ancestors, as SGLang locks a request's path: a split above a
        locked node then leaves both halves locked and unlocked together."""
        root = self.root
        for node in nodes:
            while node is not root:
                node.lock_ref += 1
                if node.lock_ref == 1:
                    if node.device is not None:
                        self.protected_pages += len(node.keys)
                    self._refresh(node)
                node = node.parent

    def unlock(self, nodes: list[Node]) -> None:
        root = self.root
        for node in nodes:
            while node is not root:
                node.lock_ref -= 1
                if node.lock_ref == 0:
                    if node.device is not None:
                        self.protected_pages -= len(node.keys)
                    self._refresh(node)
                node = node.parent

    def pin_host(self, nodes: list[Node], delta: int) -> None:
        for node in nodes:
            node.host_ref += delta
            self._refresh(node)

    def set_device(self, node: Node, pages: list[int]) -> None:
        node.device = pages
        if node.lock_ref:
            self.protected_pages += len(pages)
        node.parent.device_children += 1
        if node.host is not None:
            self.duplicates[node.id] = node
        self._refresh(node)
        if node.parent is not self.root:  # hot: most parents of a flat tree are the root
            self._refresh(node.parent)

    def set_host(self, node: Node, pages: list[int]) -> None:
        """The host copy is acknowledged: the node is backed up."""
        node.host = pages
        node.parent.host_children += 1
        if node.device is not None:
            self.duplicates[node.id] = node
        self._refresh(node)
        if node.parent is not self.root:  # hot: most parents of a flat tree are the root
            self._refresh(node.parent)

    def _drop_device(self, node: Node) -> list[int]:
        pages, node.device = node.device, None
        assert pages is not None  # callers drop a copy the node has
        if node.lock_ref:
            self.protected_pages -= len(pages)
        node.parent.device_children -= 1
        self.duplicates.pop(node.id, None)
        self._refresh(node)
        if node.parent is not self.root:  # hot: most parents of a flat tree are the root
            self._refresh(node.parent)
        return pages

    def _drop_host(self, node: Node) -> list[int]:
        pages, node.host = node.host, None
        assert pages is not None  # callers drop a copy the node has
        node.parent.host_children -= 1
        self.duplicates.pop(node.id, None)
        self._refresh(node)
        if node.parent is not self.root:  # hot: most parents of a flat tree are the root
            self._refresh(node.parent)
        return pages

    def _delete(self, node: Node) -> None:
        """Remove a node on no tier and without children."""
        parent = node.parent
        del parent.children[node.keys[0]]
        self.device_leaves.discard(node)
        self.host_leaves.discard(node)
        self.duplicates.pop(node.id, None)
        self._refresh(parent)

    # -- structure ------------------------------------------------------------------------------

    def _new_node(self, keys: list[str], storage_keys: list[str], depth: int, parent: Node) -> Node:
        node = Node(next(self._ids), keys, storage_keys, depth, parent)
        parent.children[keys[0]] = node
        return node

    def split(self, node: Node, pages: int) -> Node:
        """Cut `node` after `pages` pages; returns the new prefix node, parent of the rest.
        Both halves keep the node's hit count and request locks, as SGLang's split does; a host pin
        stays with `node` (the pinned anchor is the deeper half). Both get a fresh access stamp:
        SGLang stamps the split-off tail as it walks (0.5.14's match and insert stamp a child before
        splitting it, then the new head is created; 0.5.23 creates the head, then stamps the tail;
        docs/controller.md#eviction-policies), so the tail is not evicted as if it were old."""
        parent = node.parent
        head = Node(next(self._ids), node.keys[:pages], node.storage_keys[:pages], node.depth, parent)
        head.hit_count = node.hit_count
        if self.version == V0_5_14:
            node.last_access = next(self._clock)
            head.last_access = next(self._clock)
        else:
            head.last_access = next(self._clock)
            node.last_access = next(self._clock)
        head.lock_ref = node.lock_ref
        if node.device is not None:
            head.device, node.device = node.device[:pages], node.device[pages:]
            head.device_children = 1
            if node.host is not None:
                self.duplicates[head.id] = head
        if node.host is not None:
            head.host, node.host = node.host[:pages], node.host[pages:]
            head.host_children = 1
        head.stored, node.stored = min(node.stored, pages), max(0, node.stored - pages)
        parent.children[head.keys[0]] = head
        node.keys, node.storage_keys = node.keys[pages:], node.storage_keys[pages:]
        node.depth += pages
        node.parent = head
        head.children[node.keys[0]] = node
        self._refresh(head)
        return head

    def match(self, keys: list[str]) -> list[Node]:
        """The nodes covering the longest prefix of `keys` in the tree, root excluded; a node the
        match ends inside is split there. The path is stamped as accessed."""
        path: list[Node] = []
        node, pos, n = self.root, 0, len(keys)
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None:
                break
            common = _common_pages(child.keys, keys, pos)
            if common < len(child.keys):
                child = self.split(child, common)
            path.append(child)
            pos += common
            node = child
        if path:
            self.touch(path)
        return path

    def _insert_run(
        self,
        anchor: Node,
        keys: list[str],
        storage_keys: list[str],
        start: int,
        pages: list[int],
        place: Callable[[Node, list[int]], bool],
    ) -> tuple[list[Node], list[int], list[Node], Node | None]:
        """Insert pages start.. of a prompt, held in one tier's `pages`, below `anchor`: walk the
        existing nodes (splitting where the run diverges), where `place(node, pages)` gives a node
        its share or returns False when it keeps its own copy; the rest becomes one new leaf.
        Returns (nodes walked and created, in order; unused pages; nodes that kept their copy; the
        new leaf or None)."""
        walked: list[Node] = []
        kept: list[Node] = []
        unused: list[int] = []
        node, i, n = anchor, 0, len(pages)
        while i < n:
            child = node.children.get(keys[start + i])
            if child is None:
                break
            common = _common_pages(child.keys, keys, start + i)
            if common < len(child.keys):
                child = self.split(child, common)
            share = pages[i : i + common]
            if not place(child, share):
                unused.extend(share)
                kept.append(child)
            walked.append(child)
            i += common
            node = child
        leaf = None
        if i < n:
            leaf = self._new_node(keys[start + i : start + n], storage_keys[start + i : start + n], start + i, node)
            place(leaf, pages[i:])
            walked.append(leaf)
        self.touch(walked)
        return walked, unused, kept, leaf

    def _place_device(self, node: Node, pages: list[int]) -> bool:
        """Recomputed KV revives a node off the device; one on the device keeps its pages."""
        if node.device is not None:
            return False
        self.set_device(node, pages)
        return True

    def _place_host(self, node: Node, pages: list[int]) -> bool:
        """Pages read from L3 become the host copy of a node on no tier, backed up and stored."""
        if node.host is not None or node.device is not None:
            return False
        self.set_host(node, pages)
        node.stored = len(node.keys)
        return True

    def insert_device(
        self, anchor: Node, keys: list[str], storage_keys: list[str], start: int, pages: list[int]
    ) -> tuple[list[Node], list[int], list[Node]]:
        """Pages start.. of a prompt computed into device `pages`, inserted below `anchor`; pages
        of nodes already on the device come back as duplicates. Returns (the nodes walked and
        created, in order; the duplicate device pages; the nodes an insert counts a hit on: those
        already on the device, and the new leaf)."""
        walked, unused, resident, leaf = self._insert_run(anchor, keys, storage_keys, start, pages, self._place_device)
        if leaf is not None:
            resident.append(leaf)
        return walked, unused, resident

    def insert_host(
        self, anchor: Node, keys: list[str], storage_keys: list[str], start: int, pages: list[int]
    ) -> tuple[list[Node], list[int]]:
        """Pages start.. of a prompt read from L3 into host `pages`, inserted below `anchor` as
        backed-up, stored nodes off the device. Pages already in the tree keep their copy and the
        new host pages come back unused. Returns (the nodes walked and created, unused host pages)."""
        walked, unused, _, _ = self._insert_run(anchor, keys, storage_keys, start, pages, self._place_host)
        return walked, unused

    # -- eviction: docs/controller.md#device-eviction, #host-eviction ----------------------------

    def _pop_candidate(self, heap: list[tuple[Any, ...]], members: set[Node], bit: int) -> Node | None:
        """The candidate of `members` first in policy order, off `heap` (lazy: see __init__); `bit`
        is the heap's Node.heaped bit. The node returned has no entry left."""
        priority = self.priority
        if len(heap) > 2 * len(members) + 64:  # mostly dead entries: rebuild
            for entry in heap:
                entry[-1].heaped &= ~bit
            heap[:] = [priority(n) for n in members]
            heapify(heap)
            for member in members:
                member.heaped |= bit
        while heap:
            entry = heappop(heap)
            node: Node = entry[-1]
            if node not in members:
                node.heaped &= ~bit
                continue
            now = priority(node)
            if now != entry:
                heappush(heap, now)
                continue
            node.heaped &= ~bit
            return node
        return None

    def evict_device(
        self,
        pages: int,
        write_back: Callable[[Node], bool] | None,
        freed: list[int],
        host_freed: list[int] | None = None,
        hold_written: bool = False,
    ) -> tuple[int, int]:
        """Evict whole device leaves in policy order until `pages` pages are freed (or none is left).

        A backed-up leaf keeps its host copy; one that is not is deleted, unless `write_back` is
        given: it is then backed up first (write_back returns False when no host page can be had,
        and the leaf stays; with `host_freed`, the fallback from 0.5.15: the leaf and its host-only
        descendants leave the tree unless one of them is locked, their host pages appended to
        `host_freed`; docs/controller.md#device-eviction). With `hold_written` (0.5.14-0.5.18), the
        leaves this call backs up keep their host copies out of host eviction until it returns, or
        until a drop (0.5.15-0.5.18 release them before dropping). Freed device pages are appended
        to `freed` as they go. Returns (nodes evicted, pages dropped from every tier).
        """
        heap, leaves = self._device_heap, self.device_leaves
        start = len(freed)
        evicted = dropped = 0
        passed_over: dict[Node, None] = {}  # candidates this call leaves in place: back on the heap after
        held: list[Node] = []  # hold_written: backed up by this call, pinned on host until it ends
        try:
            while len(freed) - start < pages:
                node = self._pop_candidate(heap, leaves, DEVICE_HEAP)
                if node is None:
                    break
                if node in passed_over:
                    continue  # a second entry of a node this call already left in place
                if node.host is None and write_back is not None:
                    if write_back(node):
                        if hold_written:
                            self.pin_host([node], 1)
                            held.append(node)
                    else:
                        if host_freed is not None and held:
                            self.pin_host(held, -1)
                            held.clear()
                        lost = 0 if host_freed is None else self._drop_unbacked_subtree(node, freed, host_freed)
                        if not lost:
                            passed_over[node] = None
                            continue
                        evicted += 1
                        dropped += lost
                        continue
                if node.host is None:
                    if node.children:
                        passed_over[node] = None
                        continue  # its children still need it in the tree, and it has no other copy
                    freed.extend(self._drop_device(node))
                    dropped += len(node.keys)
                    self._delete(node)
                else:
                    freed.extend(self._drop_device(node))
                evicted += 1
        finally:
            if held:
                self.pin_host(held, -1)
            for node in passed_over:
                if node in leaves and not node.heaped & DEVICE_HEAP:
                    node.heaped |= DEVICE_HEAP
                    heappush(heap, self.priority(node))
        return evicted, dropped

    def _drop_unbacked_subtree(self, node: Node, freed: list[int], host_freed: list[int]) -> int:
        """write_back from 0.5.15, when a device leaf's backup got no host page: drop the leaf and its
        host-only descendants (none of them locked, else nothing) from every tier; returns the
        pages dropped (0: none)."""
        descendants: list[Node] = []
        stack = list(node.children.values())
        while stack:
            cur = stack.pop()
            if cur.lock_ref or cur.host_ref:
                return 0
            descendants.append(cur)
            stack.extend(cur.children.values())
        if node.host_ref:
            return 0
        for desc in reversed(descendants):  # children before their parents
            if desc.host is not None:
                host_freed.extend(self._drop_host(desc))
            self._delete(desc)
        freed.extend(self._drop_device(node))
        self._delete(node)
        return len(node.keys) + sum(len(desc.keys) for desc in descendants)

    def reclaim_host_duplicates(self, pages: int, freed: list[int]) -> int:
        """0.5.23 write_back: free host copies of device-resident nodes, sparing first the device
        leaves (about to move to host anyway), then taking them too. Returns nodes reclaimed."""
        start, reclaimed = len(freed), 0
        for spare_leaves in (True, False):
            for node in list(self.duplicates.values()):
                if len(freed) - start >= pages:
                    return reclaimed
                if node.host_ref or node.device is None or node.host is None:
                    continue
                if spare_leaves and node in self.device_leaves:
                    continue
                freed.extend(self._drop_host(node))
                reclaimed += 1
        return reclaimed

    def evict_host(self, pages: int, freed: list[int]) -> tuple[int, int]:
        """Evict host leaves (nodes already off the device) in policy order until `pages` pages are
        freed; each leaves the tree. Returns (nodes evicted, pages dropped)."""
        start = len(freed)
        evicted = dropped = 0
        heap, leaves = self._host_heap, self.host_leaves
        while len(freed) - start < pages:
            node = self._pop_candidate(heap, leaves, HOST_HEAP)
            if node is None:
                break
            # _drop_host then _delete, fused: a host leaf is off the device, and the parent's
            # candidacy is settled once, on its final state (what the two refreshes end with).
            host, node.host = node.host, None
            assert host is not None  # a host leaf has its copy
            freed.extend(host)
            parent = node.parent
            parent.host_children -= 1
            del parent.children[node.keys[0]]
            self.device_leaves.discard(node)
            leaves.discard(node)
            self.duplicates.pop(node.id, None)
            self._refresh(parent)
            dropped += len(node.keys)
            evicted += 1
        return evicted, dropped

    # -- whole-tree views -----------------------------------------------------------------------

    def all_nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def full_nodes(self, keys: list[str]) -> tuple[list[Node], int]:
        """The nodes wholly inside the longest prefix of `keys` in the tree, and their pages;
        nothing is split or stamped."""
        path, node, pos = [], self.root, 0
        while pos < len(keys):
            child = node.children.get(keys[pos])
            if child is None or _common_pages(child.keys, keys, pos) < len(child.keys):
                break
            path.append(child)
            pos += len(child.keys)
            node = child
        return path, pos

    def local_match(self, keys: list[str]) -> tuple[int, int, Node | None]:
        """(device pages, device + host pages, the node it ends in) a match of `keys` would find;
        nothing is split or stamped."""
        device = local = 0
        node, on_device, last = self.root, True, None
        while local < len(keys):
            child = node.children.get(keys[local])
            if child is None or (child.device is None and child.host is None):
                break
            common = _common_pages(child.keys, keys, local)
            on_device = on_device and child.device is not None
            if on_device:
                device += common
            local += common
            last = child
            if common < len(child.keys):
                break
            node = child
        return device, local, last

    def locked_prefix_pages(self, keys: list[str]) -> int:
        """Pages of the longest prefix of `keys` already locked on the device by running requests
        (locks cover a node's ancestors, so they form a prefix)."""
        locked, node = 0, self.root
        while locked < len(keys):
            child = node.children.get(keys[locked])
            if child is None or child.device is None or not child.lock_ref:
                break
            common = _common_pages(child.keys, keys, locked)
            locked += common
            if common < len(child.keys):
                break
            node = child
        return locked

    def pages_of(self, keys: list[str]) -> list[PageView]:
        """One view per page of the longest prefix of `keys` in the tree."""
        path, pos = self.full_nodes(keys)
        views = page_views(path)
        node = path[-1] if path else self.root
        child = node.children.get(keys[pos]) if pos < len(keys) else None
        if child is not None:
            views += [PageView(child, i) for i in range(_common_pages(child.keys, keys, pos))]
        return views
