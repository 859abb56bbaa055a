"""The Grafana board and the alert rules: valid for Prometheus (promtool), and every metric they
name exists in SGLang's collector source of the releases that define it, or in a real master's /metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from hicache_ops.commands.watch.catalog import BY_NAME, MASTER_METRICS, SGLANG_METRICS
from sglang_0_5_14 import require_root

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "hicache.rules.yml"
BOARD = REPO / "dashboards" / "hicache.json"
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
SOURCES = {
    "0.5.23": Path(__import__("sglang").__file__).parents[1] / COLLECTOR,
    "0.5.14": require_root() / COLLECTOR,
}
NAME = re.compile(r"\b(sglang:[a-z0-9_]+|master_[a-z0-9_]+)")
HISTOGRAM_PARTS = re.compile(r"_(bucket|sum|count)$")


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make system-deps` installs Debian's prometheus package"
    return found


def source_names(version: str) -> set[str]:
    return set(re.findall(r'name="(sglang:[a-z0-9_]+)"', SOURCES[version].read_text()))


def board_exprs() -> list[str]:
    board = json.loads(BOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def rule_exprs() -> list[str]:
    return re.findall(r"expr: \|\n((?:          .*\n)+)", RULES.read_text())


def test_rules_pass_promtool():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout


def test_board_queries_parse_as_promql(tmp_path):
    """Each panel query, its Grafana interval replaced, is a recording rule promtool parses."""
    exprs = board_exprs()
    assert len(exprs) >= 15
    lines = ["groups:", "  - name: board", "    rules:"]
    for i, expr in enumerate(exprs):
        lines += [f"      - record: board:q{i}", f"        expr: {json.dumps(expr.replace('$__rate_interval', '5m'))}"]
    path = tmp_path / "board.rules.yml"
    path.write_text("\n".join(lines) + "\n")
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_query_fails_the_parse(tmp_path):
    path = tmp_path / "bad.rules.yml"
    path.write_text('groups:\n  - name: b\n    rules:\n      - record: b:q\n        expr: "sum by (instance (x)"\n')
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_catalog_matches_each_releases_collector():
    for version in SOURCES:
        names = source_names(version)
        for metric in SGLANG_METRICS:
            assert (metric.name in names) == metric.exists_in(version), (version, metric.name)


@pytest.mark.parametrize("what", ["board", "rules"])
def test_every_sglang_metric_named_exists_in_the_collectors(what):
    exprs = board_exprs() if what == "board" else rule_exprs()
    named = {HISTOGRAM_PARTS.sub("", n) for e in exprs for n in NAME.findall(e) if n.startswith("sglang:")}
    assert len(named) >= 8
    for name in named:
        assert name in BY_NAME, name
        for version in SOURCES:
            assert (name in source_names(version)) == BY_NAME[name].exists_in(version), (version, name)


def test_every_master_metric_named_is_exported_by_a_real_master(mooncake_master):
    text = httpx.get(f"http://{mooncake_master.metrics_address}/metrics", timeout=10).text
    exported = {line.split()[0].split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}
    named = {n for e in board_exprs() + rule_exprs() for n in NAME.findall(e) if n.startswith("master_")}
    assert len(named) >= 8
    assert named <= exported, named - exported
    assert set(MASTER_METRICS) <= exported, set(MASTER_METRICS) - exported


def test_rules_fire_on_their_condition_and_not_without_it():
    """promtool's rule unit tests (tests/watch/rules_test.yml): the version-skew alert fires while the
    master sees no put and stays quiet once it does; the storage-hit alert names only the instance
    without storage hits."""
    tests = Path(__file__).with_name("rules_test.yml")
    out = subprocess.run(
        [promtool(), "test", "rules", tests.name], capture_output=True, text=True, timeout=120, cwd=tests.parent
    )
    assert out.returncode == 0, out.stdout + out.stderr
