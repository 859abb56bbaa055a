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

import itertools
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush


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


class _LeafQueue:
    """Eviction candidates (last_access, seq, node), popped smallest first, as from one heap.

    Stamps come from a monotone clock, so almost every entry is pushed at or above the newest
    one queued: those go to a FIFO in O(1). The few pushed below it (a parent that becomes a
    leaf when its child leaves, a pinned entry put back) go to a heap. The smaller of the two
    heads is the minimum, so entries come out in exactly the order a single heap gives.
    """

    __slots__ = ("fifo", "heap")

    def __init__(self) -> None:
        self.fifo: deque[tuple[int, int, PageNode]] = deque()
        self.heap: list[tuple[int, int, PageNode]] = []

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)

    def push(self, entry: tuple[int, int, PageNode]) -> None:
        fifo = self.fifo
        if not fifo or entry > fifo[-1]:
            fifo.append(entry)
        else:
            heappush(self.heap, entry)

    def pop(self) -> tuple[int, int, PageNode]:
        heap = self.heap
        if heap:
            fifo = self.fifo
            if not fifo or heap[0] < fifo[0]:
                return heappop(heap)
            return fifo.popleft()
        return self.fifo.popleft()

    def clear(self) -> None:
        self.fifo.clear()
        self.heap.clear()


class PageTree:
    def __init__(self) -> None:
        self.nodes: dict[str, PageNode] = {}
        self._clock = itertools.count(1)
        self._seq = itertools.count()
        self._device_heap = _LeafQueue()
        self._host_heap = _LeafQueue()

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
        seq = self._seq
        device_push, host_push = self._device_heap.push, self._host_heap.push
        for access, node in enumerate(nodes, base):
            node.last_access = access
            # _offer, inlined: this loop runs once per page of every request.
            if node.device_page >= 0 and node.device_children == 0:
                device_push((access, next(seq), node))
            if node.host_page >= 0 and node.host_children == 0:
                host_push((access, next(seq), node))
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
        if node is not None:
            return node
        # add(), inlined: this runs once per computed or fetched page.
        node = PageNode(key, storage_key, parent, depth)
        node.last_access = next(self._clock)
        self.nodes[key] = node
        if parent is not None:
            parent.children += 1
        return node

    def insert_on_device(
        self, tree_keys: list[str], storage_keys: list[str], start: int, pages: list[int], parent: PageNode | None
    ) -> tuple[list[PageNode], list[int]]:
        """Pages start, start+1, ... of a prompt: get_or_add each, give it the next device page
        (set_device with offer=False) and pin it (lock_ref + 1), in one loop.

        The caller must re-stamp the nodes with touch() before any eviction (the prefill's compute
        step). Returns (the nodes, the device pages not used because a node already had one).
        """
        nodes, clock = self.nodes, self._clock
        out: list[PageNode] = []
        unused: list[int] = []
        for i, page in enumerate(pages, start):
            key = tree_keys[i]
            node = nodes.get(key)
            if node is None:  # add(), inlined
                node = PageNode(key, storage_keys[i], parent, i)
                node.last_access = next(clock)
                nodes[key] = node
                if parent is not None:
                    parent.children += 1
            if node.device_page >= 0:
                unused.append(page)
            else:
                if node.parent is not None:
                    node.parent.device_children += 1
                node.device_page = page
            node.lock_ref += 1
            out.append(node)
            parent = node
        return out, unused

    def insert_on_host(
        self, tree_keys: list[str], storage_keys: list[str], start: int, pages: list[int], parent: PageNode | None
    ) -> list[PageNode]:
        """Pages start, start+1, ... of a prompt read from L3: get_or_add each, give it the next
        host page (set_host with offer=False) and mark it stored, in one loop. The caller offers
        them with touch() before any eviction."""
        nodes, clock = self.nodes, self._clock
        out: list[PageNode] = []
        for i, page in enumerate(pages, start):
            key = tree_keys[i]
            node = nodes.get(key)
            if node is None:
                node = PageNode(key, storage_keys[i], parent, i)
                node.last_access = next(clock)
                nodes[key] = node
                if parent is not None:
                    parent.children += 1
            if node.host_page < 0 and node.parent is not None:
                node.parent.host_children += 1
            node.host_page = page
            node.backed_up = True
            node.stored = True
            out.append(node)
            parent = node
        return out

    # -- tier state changes keep the parents' child counts right ---------------------------------

    # (_offer is inlined below where it runs once per page: device entry first, then host.)

    def set_device(self, node: PageNode, page: int, *, offer: bool = True) -> None:
        """`offer=False` when the node is pinned until `touch` re-stamps it with no eviction in
        between: the entry offered here could then never be popped as a live leaf."""
        parent = node.parent
        if node.device_page < 0 and parent is not None:
            parent.device_children += 1
        node.device_page = page
        if not offer:
            return
        if page >= 0 and node.device_children == 0:
            self._device_heap.push((node.last_access, next(self._seq), node))
        if node.host_page >= 0 and node.host_children == 0:
            self._host_heap.push((node.last_access, next(self._seq), node))

    def set_device_many(self, nodes: list[PageNode], pages: list[int]) -> None:
        """set_device(node, page) for each pair, in order, in one loop."""
        device_push, host_push, seq = self._device_heap.push, self._host_heap.push, self._seq
        for node, page in zip(nodes, pages):
            parent = node.parent
            if node.device_page < 0 and parent is not None:
                parent.device_children += 1
            node.device_page = page
            if page >= 0 and node.device_children == 0:
                device_push((node.last_access, next(seq), node))
            if node.host_page >= 0 and node.host_children == 0:
                host_push((node.last_access, next(seq), node))

    def clear_device(self, node: PageNode) -> int:
        page = node.device_page
        node.device_page = -1
        parent = node.parent
        if parent is not None:
            parent.device_children -= 1
            self._offer(parent)
        if node.host_page >= 0 and node.host_children == 0:
            self._host_heap.push((node.last_access, next(self._seq), node))
        return page

    def set_host(self, node: PageNode, page: int, *, offer: bool = True) -> None:
        """`offer=False` when the caller offers the nodes itself once a batch is in (`offer_all`)."""
        if node.host_page < 0 and node.parent is not None:
            node.parent.host_children += 1
        node.host_page = page
        node.backed_up = True
        if offer:
            self._offer(node)

    def offer_all(self, nodes: list[PageNode]) -> None:
        """Offer the leaves of a batch set with `offer=False`, in one pass.

        Equivalent to offering each node as it was set: a node that stopped being a host leaf
        within the batch can be popped live again only after a child leaves the host, and that
        offers it anew with the same stamp, so its earlier entry would only duplicate the new one
        (the host eviction treats duplicates alike). Device leafness does not change in a host
        batch, so every device entry is offered as before.
        """
        device_push, host_push, seq = self._device_heap.push, self._host_heap.push, self._seq
        for node in nodes:
            if node.device_page >= 0 and node.device_children == 0:
                device_push((node.last_access, next(seq), node))
            if node.host_page >= 0 and node.host_children == 0:
                host_push((node.last_access, next(seq), node))

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
        if node.device_page >= 0 or node.host_page >= 0 or node.children:
            return False
        del self.nodes[node.key]
        parent = node.parent
        if parent is not None:
            parent.children -= 1
            # A device leaf is re-offered: the device eviction may have passed it over for having
            # children. Its host leafness did not change (the removed node was not on host), and a
            # live host leaf always has an entry already, so no host entry is offered.
            if parent.device_page >= 0 and parent.device_children == 0:
                self._device_heap.push((parent.last_access, next(self._seq), parent))
        return True

    # -- eviction candidates --------------------------------------------------------------------

    def _offer(self, node: PageNode) -> None:
        if node.device_page >= 0 and node.device_children == 0:
            self._device_heap.push((node.last_access, next(self._seq), node))
        if node.host_page >= 0 and node.host_children == 0:
            self._host_heap.push((node.last_access, next(self._seq), node))

    # -- eviction in one pass (the per-page hot path of the cache) ------------------------------

    def evict_device(
        self, n: int, freed: list[int], write_back: Callable[[PageNode], object] | None = None
    ) -> int:
        """Evict up to `n` unpinned device leaves, least recently used first.

        A leaf that is backed up leaves the device and keeps its host copy; one that is not is
        dropped (it leaves the tree unless it has children), except that a leaf with children and
        no host copy is passed over: its children still need it. `write_back(node)`, when given,
        is called first for a leaf with no host copy (the write_back policy backs it up then).
        The freed device pages are appended to `freed` in eviction order as they go (so a caller
        gets them back even if `write_back` raises); returns how many of them were dropped. Each
        eviction is clear_device() then remove_if_unused(), inlined for the hot path.
        """
        queue, nodes, seq = self._device_heap, self.nodes, self._seq
        fifo, heap = queue.fifo, queue.heap
        device_push = queue.push
        evicted = dropped = 0
        skipped = []
        # The entries the last eviction offered for its parent (clear_device's, and
        # remove_if_unused's duplicate), held back instead of pushed: when the first is smaller
        # than both heads it is exactly the entry the queue would pop next, so it is taken
        # without a push and a pop; otherwise both go into the queue as usual.
        pending: list[tuple[int, int, PageNode]] = []
        try:
            while True:
                duplicate = None
                if pending:
                    first = pending[0]
                    if (fifo and fifo[0] < first) or (heap and heap[0] < first):
                        for held in pending:
                            device_push(held)
                        pending = []
                        continue
                    entry = first
                    if len(pending) > 1:
                        duplicate = pending[1]
                    pending = []
                elif fifo or heap:
                    entry = heappop(heap) if heap and (not fifo or heap[0] < fifo[0]) else fifo.popleft()
                else:
                    break
                node = entry[2]
                if (
                    entry[0] != node.last_access
                    or node.device_page < 0
                    or node.device_children
                    or nodes.get(node.key) is not node
                ):
                    if duplicate is not None:
                        device_push(duplicate)
                    continue  # stale entry
                if node.lock_ref:
                    skipped.append(entry)
                    if duplicate is not None:
                        device_push(duplicate)
                    continue
                if write_back is not None and not node.backed_up:
                    write_back(node)
                if not node.backed_up and node.children:
                    if duplicate is not None:
                        device_push(duplicate)
                    continue  # its children still need it in the tree, and it has no other copy
                # The node leaves the device now: a held duplicate of its entry could only ever be
                # popped stale (the node left the tree, or it is back on the device only through a
                # load-back that offers it anew and pins it), so it is dropped.
                #
                # clear_device(), inlined. Its host offers are left out: leaving the device changes
                # no node's host leafness, and a live host leaf always has an entry already (the
                # host eviction treats duplicates alike), so they could only add duplicates.
                freed.append(node.device_page)
                node.device_page = -1
                parent = node.parent
                if parent is not None:
                    parent.device_children -= 1
                    if parent.device_page >= 0 and parent.device_children == 0:
                        pending.append((parent.last_access, next(seq), parent))
                if not node.backed_up:
                    dropped += 1
                    # remove_if_unused(), inlined
                    if node.host_page < 0 and not node.children:
                        del nodes[node.key]
                        if parent is not None:
                            parent.children -= 1
                            if parent.device_page >= 0 and parent.device_children == 0:
                                pending.append((parent.last_access, next(seq), parent))
                evicted += 1
                if evicted >= n:
                    break
        finally:
            for held in pending:
                device_push(held)
            for entry in skipped:  # pinned now, evictable later
                device_push(entry)
        return dropped

    def evict_host(self, n: int, pinned: set[int], freed: list[int]) -> int:
        """Evict up to `n` host leaves, least recently used first, skipping nodes with a host pin
        (`host_ref`) or whose id() is in `pinned`. A node on no tier afterwards leaves the tree.
        Appends the freed host pages to `freed` in eviction order; returns how many were dropped.
        Each eviction is clear_host() then remove_if_unused(), inlined for the hot path.
        """
        queue, nodes, seq = self._host_heap, self.nodes, self._seq
        fifo, heap = queue.fifo, queue.heap
        device_push, host_push = self._device_heap.push, queue.push
        evicted = dropped = 0
        skipped = []
        held = None  # the parent's entry the last eviction offered, held back as in evict_device
        try:
            while True:
                if held is not None:
                    if (fifo and fifo[0] < held) or (heap and heap[0] < held):
                        host_push(held)
                        held = None
                        continue
                    entry, held = held, None
                elif fifo or heap:
                    entry = heappop(heap) if heap and (not fifo or heap[0] < fifo[0]) else fifo.popleft()
                else:
                    break
                node = entry[2]
                if (
                    entry[0] != node.last_access
                    or node.host_page < 0
                    or node.host_children
                    or nodes.get(node.key) is not node
                ):
                    continue  # stale entry
                if node.host_ref or id(node) in pinned:
                    skipped.append(entry)
                    continue
                # clear_host(), inlined
                freed.append(node.host_page)
                node.host_page = -1
                node.backed_up = False
                parent = node.parent
                if parent is not None:
                    parent.host_children -= 1
                    if parent.device_page >= 0 and parent.device_children == 0:
                        device_push((parent.last_access, next(seq), parent))
                    if parent.host_page >= 0 and parent.host_children == 0:
                        held = (parent.last_access, next(seq), parent)
                if node.device_page < 0:
                    dropped += 1
                    # remove_if_unused(), inlined (the node is on no tier now)
                    if not node.children:
                        del nodes[node.key]
                        if parent is not None:
                            parent.children -= 1
                            if parent.device_page >= 0 and parent.device_children == 0:
                                device_push((parent.last_access, next(seq), parent))
                evicted += 1
                if evicted >= n:
                    break
        finally:
            if held is not None:
                host_push(held)
            for entry in skipped:  # pinned now, evictable later
                host_push(entry)
        return dropped

    def clear(self) -> None:
        self.nodes.clear()
        self._device_heap.clear()
        self._host_heap.clear()
