"""Window arithmetic on exposition text: growth, resets, and the window's start."""

from __future__ import annotations

from hicache_ops.commands.watch.figures import figure
from hicache_ops.commands.watch.sampler import Sample, Target, parse_exposition


def sample(at: float, value: float) -> Sample:
    text = f'# TYPE sglang:prompt_tokens counter\nsglang:prompt_tokens_total{{model_name="m"}} {value}\n'
    return Sample(at, parse_exposition(text, "test"))


def test_growth_over_the_window():
    f = figure(sample(10.0, 100), sample(14.0, 180), "sglang:prompt_tokens_total")
    assert f == {"total": 180.0, "delta": 80.0, "rate": 20.0}


def test_a_counter_that_went_down_was_reset_and_counts_from_zero():
    f = figure(sample(10.0, 500), sample(12.0, 30), "sglang:prompt_tokens_total")
    assert f["delta"] == 30.0 and f["rate"] == 15.0


def test_the_window_slides():
    target = Target("sglang", "http://x", window=10.0)
    for at, value in [(0, 0), (5, 50), (12, 120), (20, 200)]:
        target.add(sample(float(at), value))
    # The start is the newest sample at least 10 s older than the last (12 is only 8 s older than 20).
    assert [s.at for s in target.samples] == [5.0, 12.0, 20.0]
    f = figure(target.first, target.last, "sglang:prompt_tokens_total")
    assert f["delta"] == 150.0
