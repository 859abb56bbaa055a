"""The shared Mooncake Transfer Engine: will SGLang's HiCache store reuse it? (`hicache te`)

- `rule`: ranks of a node, the reuse rule and its evaluation (docs/transfer-engine.md);
- `fix`: the smallest change that makes every rank reuse the engine;
- `report`: `check_reuse`, the entry point, and its TeReport;
- `live`: `live_check`, a real transfer through a store client built with the engine passed in.
SGLang's launch flags, extra-config and environment are read by `hicache_ops.sglang.launch`.
"""
