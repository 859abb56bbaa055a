"""`hicache serve`'s start-up panel says when L3 reads are slowed on purpose (a drill setting)."""

from __future__ import annotations

import pytest

from serve_process import Serve


@pytest.mark.parametrize("latency_ms, shown", [("0", None), ("7.5", "injected L3 latency: +7.5 ms per page read")])
def test_panel_names_injected_l3_latency(tmp_path, latency_ms, shown):
    serve = Serve(tmp_path, "--device-tokens", "1024", "--inject-l3-latency-ms", latency_ms)
    try:
        panel = serve.output.read_text()
    finally:
        serve.stop()
    assert "hicache serve" in panel
    if shown is None:
        assert "injected L3 latency" not in panel
    else:
        assert shown in panel
