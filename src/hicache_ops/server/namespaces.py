"""The request namespaces (extra_key / cache_salt) a serve has keyed pages under, made visible on
the master it shares with other instances (docs/serve-api.md#namespaces-on-the-master).

A page key is a hash seeded by its namespace and cannot be traced back to it (docs/keys.md), so a
reader that never saw a writer's extra_key cannot name it from the page objects. Each serve
therefore leaves one small marker object per namespace it used, whose key spells the namespace:
`hicache-namespace_<hex of the JSON [extra_key, cache_salt]>`. The master's key listing then names
every namespace any serve on it used; `playbook run no-l3-hit` tries them before blaming routing.
Reading markers only lists keys (the admin API): it changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hicache_ops.errors import HicacheError

if TYPE_CHECKING:
    from hicache_ops.mooncake.store_client import StoreClient

# A request namespace: (extra_key, cache_salt), None for either when not set.
Namespace = tuple[str | None, str | None]

MARKER_PREFIX = "hicache-namespace_"
# A marker key longer than this is not written (an extra_key comes from clients; keys stay short).
MAX_MARKER_KEY = 512
# At most this many namespaces are read back from the master (a bound on what a playbook tries).
MAX_READ = 32

log = logging.getLogger("hicache.serve")


def marker_key(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The marker's key for a namespace; None for the unnamespaced one or a key too long to write."""
    if extra_key is None and not cache_salt:
        return None
    key = MARKER_PREFIX + json.dumps([extra_key, cache_salt or None]).encode().hex()
    return key if len(key) <= MAX_MARKER_KEY else None


def parse_marker(key: str) -> tuple[str | None, str | None] | None:
    """(extra_key, cache_salt) of a marker key; None for any other key (or a malformed marker)."""
    if not key.startswith(MARKER_PREFIX):
        return None
    try:
        value = json.loads(bytes.fromhex(key[len(MARKER_PREFIX) :]).decode())
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(v is None or isinstance(v, str) for v in value)):
        return None
    return value[0], value[1]


def namespaces_on_master(metrics_address: str, timeout_s: float) -> list[tuple[str | None, str | None]]:
    """The namespaces the serves sharing this master left markers for, first MAX_READ in key order;
    empty when the master does not answer (the playbook's own checks then say so)."""
    from hicache_ops.mooncake.admin import AdminClient

    try:
        with AdminClient(metrics_address, timeout=timeout_s) as admin:
            keys = admin.get_all_keys()
    except HicacheError:
        return []
    found = [ns for ns in (parse_marker(k) for k in sorted(keys)) if ns is not None]
    return list(dict.fromkeys(found))[:MAX_READ]


class NamespaceMarkers:
    """Writes a marker for each namespace of a serve's cache not marked yet (once each, while L3 is up)."""

    def __init__(self) -> None:
        self.written: set[Namespace] = set()
        self._lock = threading.Lock()

    def publish(self, namespaces: Iterable[Namespace], store: StoreClient | None, l3_down: bool) -> None:
        if store is None or l3_down:
            return
        with self._lock:
            self._publish(namespaces, store)

    def _publish(self, namespaces: Iterable[Namespace], store: StoreClient) -> None:
        for ns in list(namespaces):
            if ns in self.written:
                continue
            key = marker_key(*ns)
            if key is None:
                self.written.add(ns)
                continue
            try:
                store.put(key, b"1", upsert=True, retries=1)
            except HicacheError as exc:  # a marker never fails the request; the next one retries
                log.warning("could not write the namespace marker for %s: %s", ns, exc.message)
                return
            self.written.add(ns)
