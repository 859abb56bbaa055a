"""`make gpu-check`: the checks that need a CUDA GPU, as one short run with one JSON summary.

On a CUDA host, in order (each step bounded; the whole run stays under five minutes):
  1. kernels: the kernel tests (Triton on CUDA against SGLang's host layouts, byte-verified);
  2. bench:   `hicache bench kernels --device cuda --json` (ratios against plain copies);
  3. serve:   a short `hicache serve --device cuda` session: prefill with backup (L1 -> L2 -> L3),
              flush, prefill again, and check that every page came back from L3 with verified bytes.
Without CUDA it says so and exits 0 having run nothing. `--device cpu` runs the same serve session
on the CPU (how the script itself is tested on machines without a GPU).

Exit 0 when every step that ran passed, 1 otherwise. The summary goes to --out (default
gpu-check.json) and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGE = 16


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _run(cmd: list[str], timeout: float) -> dict:
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": f"timed out after {timeout:.0f} s",
            "seconds": round(time.monotonic() - started, 1),
        }
    return {
        "ok": proc.returncode == 0,
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "tail": (proc.stdout + proc.stderr)[-2000:],
        "stdout": proc.stdout,
    }


def check_kernels() -> dict:
    out = _run([str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", "tests/kernels"], timeout=150)
    out.pop("stdout", None)
    return out


def check_bench() -> dict:
    out = _run([str(BIN / "hicache"), "bench", "kernels", "--device", "cuda", "--json"], timeout=120)
    stdout = out.pop("stdout", "")
    if out["ok"]:
        try:
            out["result"] = json.loads(stdout)
            out.pop("tail", None)
        except ValueError:
            out["ok"] = False
            out["error"] = "bench kernels printed no JSON"
    return out


def check_serve(device: str) -> dict:
    """Prefill with backup, flush L1/L2, prefill again: every page must come back from L3, verified."""
    sys.path.insert(0, str(ROOT / "tests"))  # the serve helper is shared with the tests
    from hicache_ops.mooncake.net import free_port
    from hicache_ops.server.client import ServeClient

    # Above SGLang's default prefetch threshold (256 tokens), so the second prefill reads L3.
    tokens = list(range(1000, 1000 + 32 * PAGE))
    port = free_port()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hicache-gpu-check-") as logs:
        proc = subprocess.Popen(
            [
                str(BIN / "hicache"),
                "serve",
                "--device",
                device,
                "--port",
                str(port),
                "--page-size",
                str(PAGE),
                "--log-dir",
                logs,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = ServeClient(f"http://127.0.0.1:{port}", timeout_s=60)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.health()
                    break
                except Exception:  # not up yet: bounded by the deadline
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log = "".join(p.read_text()[-1500:] for p in Path(logs).glob("*.log"))
                        return {"ok": False, "error": "serve did not start", "log_tail": log}
                    time.sleep(0.5)
            first = client.prefill(tokens, backup=True)
            client.flush()
            second = client.prefill(tokens)
            stats = client.stats()
        finally:
            client.close()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    all_stored = first.get("stored_pages", 0) * PAGE == len(tokens)
    # SGLang caps a match at len - 1 tokens, so the last page may be recomputed.
    from_l3 = second.get("storage_hit", 0) >= len(tokens) - PAGE
    ok = all_stored and from_l3 and second.get("mismatched_pages") == 0
    return {
        "ok": bool(ok),
        "device": device,
        "seconds": round(time.monotonic() - started, 1),
        "first": {k: first.get(k) for k in ("computed", "stored_pages", "bytes_written_to_l3")},
        "second": {
            k: second.get(k)
            for k in ("device_hit", "host_hit", "storage_hit", "mismatched_pages", "bytes_read_from_l3")
        },
        "rank_devices": stats.get("config", {}).get("rank_devices"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check.json", help="where the JSON summary goes")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: run only the serve session on the CPU (a self-test of this script)",
    )
    args = parser.parse_args(argv)
    summary: dict = {"device": args.device, "steps": {}}
    if args.device == "cuda":
        if not _cuda_available():
            print("gpu-check: no CUDA device on this machine; nothing was run.")
            return 0
        import torch

        summary["gpu"] = torch.cuda.get_device_name(0)
        summary["steps"]["kernels"] = check_kernels()
        summary["steps"]["bench"] = check_bench()
    summary["steps"]["serve"] = check_serve(args.device)
    summary["ok"] = all(step["ok"] for step in summary["steps"].values())
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    sys.exit(main())
