"""A lab started with --run-dir is found by the commands run without it: `lab status` names its
folder and the option that reaches it, and the printed hints carry --run-dir (real processes; the
state file is written as `lab up` writes it, no namespaces needed)."""

from __future__ import annotations

import os
import subprocess

from hicache_ops.commands.lab import state
from serve_process import HICACHE


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([HICACHE, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60)


def test_status_without_run_dir_points_at_the_lab_that_runs_elsewhere(tmp_path, monkeypatch):
    index, default, other = tmp_path / "index", tmp_path / "default", tmp_path / "other"
    env = {state.INDEX_ENV: str(index), state.RUN_DIR_ENV: str(default)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = run("lab", "status", env=env)
    assert proc.returncode == 2 and f"no lab is up (no state in {default})" in proc.stderr, proc.stderr
    state.save(other, {"subnet": "10.77.0.0/24", "bridge": {}, "master": {}, "hosts": [], "faults": []})
    proc = run("lab", "status", env=env)
    assert proc.returncode == 2, proc.stderr
    assert f"a lab runs in {other}" in proc.stderr and f"--run-dir {other}" in proc.stderr
    assert state.run_dir_flag(other) == f" --run-dir {other}" and state.run_dir_flag(default) == ""
    state.remove(other)  # what `lab down` does last: the lab is no longer listed
    proc = run("lab", "status", env=env)
    assert "a lab runs in" not in proc.stderr and not list(index.iterdir())
