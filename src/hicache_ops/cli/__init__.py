"""The `hicache` command line: parsing, rendering and exit codes only; the work is in hicache_ops."""
