"""`bench multiturn --plot`: the hit rate of each configuration by round, beside the ceiling h_max(r),
each configuration's predicted and seen cliff marked (src/hicache_ops/commands/bench/multiturn.py runs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hicache_ops.commands.bench.multiturn import MultiturnResult
from hicache_ops.commands.bench.multiturn_workload import LABELS
from hicache_ops.errors import SettingError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_hit_rates(result: MultiturnResult, path: str) -> str:
    """Hit rate by round: one line per configuration plus the ceiling h_max(r); returns `path`."""
    import matplotlib.pyplot as plt

    fig = hit_rate_figure(result)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def hit_rate_figure(result: MultiturnResult) -> Figure:
    """The figure `plot_hit_rates` saves (the caller closes it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SettingError(
            "plot", "needs matplotlib, which is not installed.", hint="pip install matplotlib, or drop --plot."
        ) from None
    from matplotlib.ticker import MaxNLocator

    spec = result.spec
    rounds = list(range(spec.rounds))
    fig, ax = plt.subplots(figsize=(11, 5), dpi=120)
    # The ceiling is a wide pale band under the curves: a configuration that reaches it stays visible.
    ax.plot(
        rounds,
        [100 * spec.ceiling(r) for r in rounds],
        color="0.6",
        linewidth=7,
        alpha=0.35,
        solid_capstyle="butt",
        label="ceiling $h_{max}(r)$",
        zorder=1,
    )
    # Colour, dash pattern, marker and width all differ, so coinciding curves still tell apart.
    styles: dict[str, dict[str, Any]] = {
        "l1": {"color": "tab:red", "linestyle": "-", "marker": "o", "linewidth": 2.4},
        "l1_l2": {"color": "tab:orange", "linestyle": (0, (6, 3)), "marker": "s", "linewidth": 1.9},
        "l1_l2_l3": {"color": "tab:blue", "linestyle": (0, (2, 2)), "marker": "^", "linewidth": 1.4},
    }
    for name, run in result.runs.items():
        done = range(run.rounds_done)
        ax.plot(
            done,
            [100 * result.hit_rate(name, r) for r in done],
            markersize=3.5,
            label=LABELS[name],
            zorder=3,
            **styles[name],
        )
    for name, cliff in result.cliffs().items():
        predicted, leaves = cliff["predicted"], cliff["leaves_ceiling"]
        color = styles[name]["color"]
        if predicted is not None:
            ax.axvline(
                predicted,
                color=color,
                linestyle=":",
                linewidth=1,
                zorder=2,
                label=f"{LABELS[name]} pool outgrown (round {predicted})",
            )
        if leaves is not None:
            y = 100 * result.hit_rate(name, leaves)
            ax.annotate(
                f"{LABELS[name]} cliff: round {leaves}",
                xy=(leaves, y),
                xytext=(8, 14),
                textcoords="offset points",
                color=color,
                fontsize=8,
                arrowprops={"arrowstyle": "->", "color": color, "linewidth": 0.8},
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("prompt-token hit rate (%)")
    ax.set_ylim(-2, 102)
    ax.set_xlim(0, max(1, spec.rounds - 1))
    ax.grid(True, alpha=0.3)
    pools = (
        f"L1 {spec.device_tokens:,} tokens ({spec.l1_rounds_effective:.1f} rounds), "
        f"L2 {spec.host_pages * spec.page_size:,} tokens (ratio {spec.hicache_ratio:g}), {spec.write_policy}"
    )
    ax.set_title(
        f"Multi-turn hit rate: {spec.clients} clients x {spec.rounds} rounds x "
        f"({spec.new_tokens:,} + {spec.output_tokens}) tokens, page {spec.page_size}\n{pools}",
        fontsize=9,
    )
    # Outside the axes: inside, it covers the tail of the curves.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
    fig.tight_layout()
    return fig
