"""One byte formatter, its unit system named at each call: decimal where SGLang counts GB, binary
where Mooncake counts MiB."""

from __future__ import annotations

import pytest

from cli_runner import hicache
from hicache_ops.units import format_bytes


@pytest.mark.parametrize(
    "n, units, text",
    [
        (999, "decimal", "999 B"),
        (1000, "decimal", "1.00 KB"),
        (2_004_877_312, "decimal", "2.00 GB"),
        (1023, "binary", "1023 B"),
        (256 << 20, "binary", "256.00 MiB"),
        (3 << 40, "binary", "3.00 TiB"),
        (5 * 10**15, "decimal", "5000.00 TB"),
    ],
)
def test_format_bytes_names_its_units(n, units, text):
    assert format_bytes(n, units) == text


def test_host_pool_sizes_read_in_decimal_gb():
    result = hicache(["inspect", "layout", "--preset", "llama-3.1-8b", "--hicache-size", "2"])
    assert result.exit_code == 0, result.output
    assert "2.00 GB per rank (2004877312 B)" in result.stdout


def test_segment_sizes_read_in_binary_units(mooncake_master, mooncake_segment_owner):
    result = hicache(["inspect", "store", "--master", mooncake_master.metrics_address])
    assert result.exit_code == 0, result.output
    assert "256.00 MiB" in result.stdout  # the segment owner's 256 MiB segment
