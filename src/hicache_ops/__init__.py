"""hicache-ops: make every step between SGLang HiCache and a Mooncake L3 tier visible and testable."""

__version__ = "0.1.0"
