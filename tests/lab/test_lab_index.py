"""Which lab a command without --run-dir means: `lab status` and `lab fault` act on the only lab up
(the index knows it), refuse naming every lab when several are up (as bare `lab down` does), and the
printed hints carry --run-dir whenever a command without it would not reach the lab (real processes;
the state file is written as `lab up` writes it, no namespaces needed)."""

from __future__ import annotations

import json
import os
import subprocess

from hicache_ops.commands.lab import state, topology
from serve_process import HICACHE


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != state.RUN_DIR_ENV}
    return subprocess.run([HICACHE, *args], capture_output=True, text=True, env={**full, **env}, timeout=60)


def _lab(folder, lab_id: str) -> None:
    bridge = {"name": topology.bridge_name(lab_id), "address": "10.213.98.254"}
    lab = {"id": lab_id, "subnet": "10.213.98.0/24", "bridge": bridge, "master": {}, "hosts": [], "faults": []}
    state.save(folder, lab)


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


def test_status_and_fault_without_run_dir_act_on_the_only_lab_and_refuse_several(tmp_path, monkeypatch):
    monkeypatch.setenv(state.INDEX_ENV, str(tmp_path / "index"))
    monkeypatch.delenv(state.RUN_DIR_ENV, raising=False)
    env = {state.INDEX_ENV: str(tmp_path / "index")}
    first, second = tmp_path / "first", tmp_path / "second"
    _lab(first, "zq11")
    shown = run("lab", "status", "--json", env=env)  # the only lab up, started with --run-dir
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run_dir"] == str(first) and json.loads(shown.stdout)["id"] == "zq11"
    text = run("lab", "status", env=env)
    assert text.returncode == 0, text.stderr
    hints = text.stdout.split("state and logs:")[1]  # not the default folder: every hint names it
    assert f"status: hicache lab status --run-dir {first}" in hints
    assert f"stop with: sudo hicache lab down --run-dir {first}" in hints
    # fault reaches the lab too: it refuses *this* lab (it holds no host), not "no lab is up"
    hit = run("lab", "fault", "heal", "--on", "h1", env=env)
    assert hit.returncode == 2, hit.stderr
    assert f"the lab in {first} has no serve host" in hit.stderr and f"down --run-dir {first}" in hit.stderr
    _lab(second, "zq12")
    for args, verb in ((("status",), "show"), (("fault", "heal", "--on", "h1"), "inject the fault into")):
        both = run("lab", *args, env=env)
        assert both.returncode == 2, both.stdout
        message = f"2 labs are up on this machine ({first}, {second}); name the one to {verb}."
        assert message in both.stderr and f"hicache lab {args[0]} --run-dir {first}" in both.stderr, both.stderr
        assert "Traceback" not in both.stderr and not both.stdout
    assert state.run_dir_flag(first) == f" --run-dir {first}"
    named = run("lab", "status", "--run-dir", str(second), "--json", env=env)
    assert named.returncode == 0 and json.loads(named.stdout)["id"] == "zq12", named.stderr
    for folder in (first, second):
        state.remove(folder)
    assert state.labs_up() == [] and not any((tmp_path / "index").iterdir())
