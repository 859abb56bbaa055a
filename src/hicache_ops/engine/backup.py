"""Backing radix nodes up: device to host by the write policy, and host to L3 once.

An insert counts a hit on the nodes it passes on the device; the write policy's threshold makes
them due for a host copy (docs/controller.md#write-policies). A host copy, once acknowledged, is
written to L3 once, stopping at the first failed batch (docs/controller.md#l3-backup). write_back
makes the host copy only when a node leaves the device.
"""

from __future__ import annotations

from hicache_ops.engine.l3_prefetch import transfer_seconds
from hicache_ops.engine.parts import CacheParts
from hicache_ops.engine.tree import Node, page_views


class Backups(CacheParts):
    """TieredCache's backups (a mixin: it uses the cache's config, tree, plane, L3 tier, stats,
    observer and host allocation from pools.py)."""

    def _count_hits_and_back_up(self, counted: list[Node], nodes: list[Node], force: bool) -> int:
        """An insert counts a hit on each node it passes on the device (root to leaf order in
        `counted`); nodes reaching the policy's threshold are backed up (docs/controller.md#write-policies)."""
        threshold = self._write_threshold
        if threshold is not None:
            for node in counted:
                node.hit_count += 1
        if force:
            due = [n for n in nodes if n.host is None]
        elif threshold is None:
            due = []
        else:
            due = [n for n in counted if n.host is None and n.hit_count >= threshold]
        if self._observer is not None:
            self._emit(
                "write_policy",
                policy=self.config.write_policy,
                threshold=threshold,
                path=page_views(nodes),
                due=page_views(due),
            )
        if not due:
            return 0
        if force:
            return sum(self._backup_node(n) for n in due)
        return self._backup_due(due)

    def _backup_due(self, nodes: list[Node]) -> int:
        """Back up to host the nodes (root to leaf order) the write policy made due; returns pages."""
        done = 0
        for node in nodes:
            if node.host is not None or node.device is None:
                continue
            parent = node.parent
            if parent is not None and parent is not self.tree.root and parent.host is None:
                if not self._chains_ancestors:
                    continue  # 0.5.14: backed-up nodes form a prefix; this one waits for its parent
                chain: list[Node] = []
                while (
                    parent is not None
                    and parent is not self.tree.root
                    and parent.host is None
                    and parent.device is not None
                ):
                    chain.append(parent)
                    parent = parent.parent
                for ancestor in reversed(chain):
                    done += self._backup_node(ancestor)
            done += self._backup_node(node)
        return done

    def _backup_node(self, node: Node) -> int:
        """Copy one node's device pages to host, then (once) to L3; returns the pages backed up."""
        n = len(node.keys)
        host_pages = self._alloc_host(n)
        if host_pages is None:
            self.stats.backup_failures += n
            self._emit(
                "backup_failed",
                pages=n,
                host_free=self.host.free,
                host_pages=self.host.capacity,
                l2=self.config.enable_l2,
            )
            return 0
        device = node.device
        if device is None:  # only a device-resident node is backed up
            self.host.give_many(host_pages)
            return 0
        moved = self.plane.backup(device, host_pages)
        if moved:
            self._l3_page_bytes = moved / n
            self.stats.bytes_d2h += moved
        self._last_backup_bytes += moved
        if self._observer is not None:
            self._emit(
                "backup_host",
                nodes=page_views([node]),
                device_pages=list(device),
                host_pages=host_pages,
                bytes=moved,
            )
        self.tree.set_host(node, host_pages)  # acknowledged: the copy above completed
        if self._observer is not None:
            self._emit("backup_ack", nodes=page_views([node]))
        if self.l3 is not None:
            self._backup_to_l3(node, node.stored)
        return n

    def _backup_to_l3(self, node: Node, first: int) -> None:
        """Write pages first.. of a backed-up node to L3. SGLang writes a node once, when its host
        copy is acknowledged, and stops at the first failed batch without retrying. Under the
        concurrency model's clock with modelled transfer time, the write is queued behind the
        ones before it and its objects appear when it ends (docs/controller.md#transfer-time)."""
        if self.l3 is None or node.host is None or first >= len(node.keys):
            return
        cfg = self.config
        if self.clock is not None and (cfg.l3_bandwidth_bytes_s is not None or cfg.l3_latency_s > 0):
            pages = len(node.keys) - first
            start = max(self.clock, self._l3_writer_free_at)
            self._l3_writer_free_at = start + transfer_seconds(
                pages, self._l3_page_bytes, cfg.l3_bandwidth_bytes_s, cfg.l3_latency_s
            )
            self.tree.pin_host([node], 1)  # its host copy is read until the write ends
            self._pending_l3_writes.append((self._l3_writer_free_at, node, first))
            return
        self._write_to_l3(node, first)

    def advance_clock(self, now: float) -> None:
        """The concurrency model's clock reached `now`: L3 writes that have ended by then put
        their objects (in the order they were queued)."""
        self.clock = now
        while self._pending_l3_writes and self._pending_l3_writes[0][0] <= now:
            _, node, first = self._pending_l3_writes.pop(0)
            self.tree.pin_host([node], -1)
            if node.host is not None:
                self._write_to_l3(node, first)

    def drain_l3_writes(self) -> None:
        """Complete every queued L3 write now (a request served outside the concurrency model)."""
        if self._pending_l3_writes:
            self.advance_clock(max(t for t, _, _ in self._pending_l3_writes))

    def _write_to_l3(self, node: Node, first: int) -> None:
        l3, host = self.l3, node.host
        if l3 is None or host is None:
            return
        ok, outcome = l3.write(node.storage_keys[first:], host[first:])
        written = 0
        for page_ok in ok:
            if not page_ok:
                break
            written += 1
        node.stored = max(node.stored, first + written)
        if self._observer is not None:
            views = page_views([node])[first:]
            self._emit("l3_write", nodes=views, ok=ok, outcome=outcome)
        self.stats.bytes_l3_write += outcome.nbytes
        self.stats.l3_objects_written += outcome.written
        self.stats.l3_side_objects_written += outcome.side_written
        self.stats.l3_objects_skipped += outcome.skipped
        self.stats.backup_failures += len(ok) - written
        self._last_l3_bytes += outcome.nbytes

    def _write_back_one(self, node: Node) -> bool:
        """write_back: back up a device leaf as it leaves; False when no host page can be had."""
        if self._backup_node(node):
            self.stats.write_back_backups += len(node.keys)
            return True
        return False
