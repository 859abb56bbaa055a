"""`bench replay --plot`: a sweep's hit rate against the swept tier's capacity, drawn from the
report's JSON (replay_report.py): all tiers together, each tier's share, the block LRU beside it, and the
unbounded marks."""

from __future__ import annotations

from typing import Any

from hicache_ops.commands.bench.replay import TIER_LABELS, TIERS
from hicache_ops.errors import SettingError


def readable_tokens(n: float) -> str:
    if n >= 10**6:
        text = f"{n / 1e6:.1f}".rstrip("0").rstrip(".")
        return f"{text}M"
    if n >= 10**3:
        return f"{n / 1e3:.0f}K"
    return f"{n:.0f}"


def plot_sweep(data: dict[str, Any], path: str) -> str:
    """Hit rate against the swept tier's capacity: all tiers together, each tier's share, the
    block LRU at the same capacity, and the unbounded marks (Figure 9 of the FAST'25 paper)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    except ImportError:
        raise SettingError(
            "plot", "needs matplotlib, which is not installed.", hint="pip install matplotlib, or drop --plot."
        ) from None
    points = data["points"]
    tier = data["sweep"]
    x = [p["capacity_tokens"] for p in points]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=120)
    ax.plot(
        x,
        [100 * p["hit_rate"] for p in points],
        color="black",
        marker="o",
        linewidth=2.2,
        label="replay, all tiers (SGLang rules)",
    )
    colors = {"l1": "tab:red", "l2": "tab:orange", "l3": "tab:blue"}
    contributing = [t for t in TIERS if any(p["tiers"][t]["cached_tokens"] for p in points)]
    for t in contributing if len(contributing) > 1 else ():
        shares = [100 * p["tiers"][t]["hit_rate"] for p in points]
        if any(shares):
            ax.plot(x, shares, color=colors[t], marker=".", linewidth=1.2, label=f"  of which {TIER_LABELS[t]}")
    ax.plot(
        x,
        [100 * p["baseline_hit_rate"] for p in points],
        color="tab:green",
        linestyle="--",
        marker="s",
        markersize=3,
        linewidth=1.2,
        label="block LRU (512-token blocks)",
    )
    ax.axhline(
        100 * data["ceiling_hit_rate"],
        color="black",
        linestyle=":",
        linewidth=1,
        label=f"unbounded, SGLang pages ({100 * data['ceiling_hit_rate']:.1f}%)",
    )
    ax.axhline(
        100 * data["baseline"]["unbounded_hit_rate"],
        color="tab:green",
        linestyle=":",
        linewidth=1,
        label=f"unbounded, block LRU ({100 * data['baseline']['unbounded_hit_rate']:.1f}%)",
    )
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(x))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: readable_tokens(v)))
    ax.set_xlabel(f"{TIER_LABELS[tier]} capacity (tokens)")
    ax.set_ylabel("prompt-token hit rate (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    cfg = data["config"]
    l3 = cfg["l3"] if not isinstance(cfg["l3"], int) else readable_tokens(cfg["l3"])
    others = {
        "l1": f"L1 {readable_tokens(cfg['l1_tokens'])}",
        "l2": "no L2" if cfg["hicache_ratio"] is None else f"L2 {cfg['hicache_ratio']:g} x L1",
        "l3": f"L3 {l3}",
    }
    fixed = ", ".join(v for k, v in others.items() if k != tier)
    ax.set_title(
        f"{data['trace']['requests_replayed']:,} requests of {data['trace']['path'].rsplit('/', 1)[-1]}, "
        f"page {cfg['page_size']}, {cfg['write_policy']}; {fixed}",
        fontsize=9,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
