"""Mooncake L3: the embedded master, the store client, the master's admin HTTP API and config.

Submodules (import the one you need; none of them imports `mooncake` at module level):
  net     HOST:PORT parsing, TCP probes, free loopback ports
  master  EmbeddedMaster: a `mooncake_master` child bound to 127.0.0.1 (start, wait ready, stop)
  config  resolve_store_config: the store config exactly as SGLang's MooncakeStoreConfig resolves it
  store   StoreClient: bounded set-up, typed errors, batch zero-copy I/O, prefix-scoped removal
  admin   AdminClient: /health, /get_all_keys, /query_key, /batch_query_keys, segments, /metrics
"""
