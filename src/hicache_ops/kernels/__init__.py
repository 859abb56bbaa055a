"""KV transfer and checksum kernels between the layer-first device pool (L1) and SGLang's host pool
layouts (L2), with a torch/numpy path for the CPU and a Triton path for CUDA. See README.md.

    backup(device, host, device_indices=..., host_indices=..., layout=..., page_size=...)
    load(host, device, host_indices=..., device_indices=..., layout=..., page_size=...)
    device_page_checksums / host_page_checksums / storage_page_checksum / canonical_page_checksums

Importing this package imports torch and numpy, never Triton (loaded on first Triton call).
"""

from hicache_ops.kernels.checksum import (
    CHECKSUM_VERSION,
    canonical_page_checksums,
    checksum_hex,
    device_page_checksums,
    host_page_checksums,
    storage_page_checksum,
)
from hicache_ops.kernels.geometry import PageGeometry, host_canonical, pool_geometry
from hicache_ops.kernels.indexing import DEFAULT_TILE
from hicache_ops.kernels.transfer import BACKENDS, backup, load

__all__ = [
    "BACKENDS",
    "CHECKSUM_VERSION",
    "DEFAULT_TILE",
    "PageGeometry",
    "backup",
    "canonical_page_checksums",
    "checksum_hex",
    "device_page_checksums",
    "host_canonical",
    "host_page_checksums",
    "load",
    "pool_geometry",
    "storage_page_checksum",
]
