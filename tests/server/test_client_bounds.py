"""ServeClient against a slow-but-alive serve (real injected L3 latency) and a real silent socket:
both bounded, exit-3 errors naming the address, told apart in the message."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.server.client import ServeClient
from serve_process import Serve


def test_slow_serve_is_told_apart_from_a_silent_one(tmp_path, silent_server):
    # Busy, not silent: other clients keep the cache (one request at a time) occupied while /health answers.
    busy = Serve(tmp_path, "--device-tokens", "4096", "--page-size", "16")
    stop = threading.Event()

    def flood(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with ServeClient(busy.url) as client:
            while not stop.is_set():
                client.prefill(rng.integers(0, 60_000, size=2048).tolist())

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        with ServeClient(busy.url, timeout_s=5.0, work_timeout_s=0.01) as client:
            messages = []
            for attempt in range(5):
                started = time.monotonic()
                try:
                    client.prefill(list(range(attempt * 1000, attempt * 1000 + 2048)))
                except UnreachableError as err:
                    messages.append(err.message)
                    assert time.monotonic() - started < 0.01 + 5.0 + 5.0
                    break
            assert messages and "is alive" in messages[0] and busy.url in messages[0], messages
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        busy.stop()

    with ServeClient(f"http://{silent_server}", timeout_s=1.0, work_timeout_s=1.0) as client:
        started = time.monotonic()
        with pytest.raises(UnreachableError, match="accepted the connection but did not answer") as err:
            client.prefetch([1, 2, 3])
        assert time.monotonic() - started < 1.0 + 1.0 + 5.0
        assert silent_server in err.value.message
    with pytest.raises(UnreachableError, match=silent_server):
        ServeClient.open(f"http://{silent_server}", timeout_s=1.0)


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport", "127.0.0.1:18080", "http://:80"])
def test_bad_urls_are_input_errors(url):
    with pytest.raises(InputError, match="--serve"):
        ServeClient(url)


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_bad_timeouts_are_input_errors(timeout):
    with pytest.raises(InputError, match="--timeout"):
        ServeClient("http://127.0.0.1:1", timeout_s=timeout)
