"""cross-host-miss on one host (everything on loopback): no false finding; a writer that is gone is named."""

from __future__ import annotations

import json

from cli_runner import hicache
from hicache_ops.server.client import ServeClient
from serve_process import Serve


def test_cross_host_miss_passes_on_one_host_then_finds_objects_gone(tmp_path_factory, tmp_path):
    writer = Serve(tmp_path_factory.mktemp("writer"), "--page-size", "16", "--prefetch-threshold", "64")
    try:
        rpc, metrics = writer.info["master_rpc_address"], writer.info["master_metrics_address"]
        reader = Serve(
            tmp_path_factory.mktemp("reader"),
            "--page-size",
            "16",
            "--prefetch-threshold",
            "64",
            "--segment-mb",
            "64",
            "--l3",
            f"mooncake://{rpc}?metrics={metrics.split(':')[1]}",
        )
        try:
            ids = list(range(50_000, 50_160))
            prompt = tmp_path / "prompt.json"
            prompt.write_text(json.dumps(ids))
            with ServeClient(writer.url) as client:
                client.prefill(ids, None, None, backup=True)
            store = json.loads(hicache(["inspect", "store", "--master", metrics, "--json"]).stdout)
            assert store["segment_problems"] == [] and len(store["segments"]) == 2
            result = hicache(
                ["playbook", "run", "cross-host-miss", "--serve", reader.url, "--prompt", prompt, "--json"]
            )
            assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "pass", result.stdout
            other = tmp_path / "never.json"
            other.write_text(json.dumps(list(range(60_000, 60_160))))
            result = hicache(["playbook", "run", "cross-host-miss", "--serve", reader.url, "--prompt", other, "--json"])
            assert json.loads(result.stdout)["finding"]["check"] == "6. The objects are gone", result.stdout
        finally:
            reader.stop()
    finally:
        writer.stop()
