"""`bench multiturn --plot` reads at a glance: whole-round ticks, the legend beside the data, each
configuration in its own line style, its cliff annotated, and the ceiling drawn."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hicache_ops.commands.bench.multiturn import run_multiturn  # noqa: E402
from hicache_ops.commands.bench.multiturn_plot import hit_rate_figure  # noqa: E402
from hicache_ops.commands.bench.multiturn_workload import MultiturnSpec  # noqa: E402


def test_plot_has_integer_ticks_outside_legend_distinct_styles_and_annotated_cliffs():
    spec = MultiturnSpec(
        clients=8, rounds=30, new_tokens=4096, output_tokens=16, page_size=64, l1_rounds=6, accounting_only=True
    )
    result = run_multiturn(spec, workers=1)
    fig = hit_rate_figure(result)
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if 0 <= t <= spec.rounds - 1]
        assert ticks and all(float(t).is_integer() for t in ticks)

        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1  # beside the axes, covering no curve

        lines = {line.get_label(): line for line in ax.get_lines()}
        assert "ceiling $h_{max}(r)$" in lines
        curves = [lines[label] for label in ("L1", "L1+L2", "L1+L2+L3")]
        assert len({(c.get_linestyle(), c.get_marker()) for c in curves}) == 3
        assert len({c.get_marker() for c in curves}) == 3  # told apart even where they coincide

        cliffs = result.cliffs()
        notes = {text.get_text() for text in ax.texts}
        assert f"L1 cliff: round {cliffs['l1']['leaves_ceiling']}" in notes
        assert f"L1+L2 cliff: round {cliffs['l1_l2']['leaves_ceiling']}" in notes
        assert cliffs["l1_l2_l3"]["leaves_ceiling"] is None and not any(n.startswith("L1+L2+L3") for n in notes)
    finally:
        plt.close(fig)
