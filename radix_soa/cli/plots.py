"""The study's figures (matplotlib, imported when a plot is asked for)."""

import numpy as np


def compact_number(x, _pos=None):
    """Tick labels, 3 significant digits: 1500 -> '1.5k', 999.9e9 -> '1T'.

    >>> [compact_number(x) for x in (12, 1500, 57_575, 999.9e9, 2e6)]
    ['12', '1.5k', '57.6k', '1T', '2M']
    """
    for suffix in ("", "k", "M", "G", "T", "P"):
        if abs(x) < 999.5 or suffix == "P":
            return f"{x:.3g}{suffix}"
        x /= 1000


def plot_figure(sweep_result, unbounded, memory, x_label, title, x_scale=1.0):
    """The study as a matplotlib ``Figure``: hit rates (top; each beside its
    unbounded value in the same unit: ids, and tokens on a block trace), the
    share of requests with any hit (middle, its own axis: it sits near 1 on
    traces with a shared system prompt) and the replay's peak index memory
    (bottom), against capacity (``x_scale`` converts ids to the x unit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    results = [r for r in sweep_result.results if r.capacity is not None]
    caps = np.array([r.capacity for r in results], dtype=float) * x_scale
    bs = unbounded.block_size
    ids = "blocks" if bs > 1 else "tokens"
    fig = Figure(figsize=(7.5, 8.5))
    FigureCanvasAgg(fig)
    ax_hit, ax_req, ax_mem = fig.subplots(3, 1, sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1.2, 1.5]})
    # each rate beside its own unbounded value, in the same unit and colour: a
    # block trace's token rate counts the partial last block and may pass the
    # unbounded *block* rate, never the unbounded token rate
    rates = [r.hit_rate for r in results]
    ax_hit.plot(caps, rates, "o-", color="tab:blue", label=f"hit rate ({ids})")
    ax_hit.axhline(unbounded.hit_rate, color="tab:blue", linestyle=":",
                   label=f"unbounded, {ids} ({unbounded.hit_rate:.3f})")
    top = max(rates + [unbounded.hit_rate])
    if bs > 1:
        tok = [r.token_hit_rate for r in results]
        ax_hit.plot(caps, tok, "d-", color="tab:orange", alpha=0.8,
                    label="token hit rate (kvcache-simulator)")
        ax_hit.axhline(unbounded.token_hit_rate, color="tab:orange", linestyle=":",
                       label=f"unbounded, tokens ({unbounded.token_hit_rate:.3f})")
        top = max(top, unbounded.token_hit_rate, *tok)
    if any(r.host_hit_rate for r in results):
        both = [r.prefill_saved_fraction for r in results]
        ax_hit.plot(caps, both, "^-", color="tab:red",
                    label="prefill saved (device + host, tokens)")
        top = max(top, *both)
    ax_hit.set_ylim(0, min(1.0, top * 1.1) or 1.0)
    ax_hit.set_ylabel("hit rate")
    ax_hit.legend(loc="lower right", fontsize=8)
    ax_req.plot(caps, [r.request_hit_rate for r in results], "s--", color="tab:purple")
    ax_req.set_ylabel("share of requests\nwith a hit")
    ax_req.set_ylim(0, 1.05)
    ax_mem.plot(caps, [r.peak_index_bytes / 1e6 for r in results], "o-", color="tab:green",
                label="replay index, peak")
    ax_mem.axhline(memory["used_bytes"] / 1e6, color="tab:green", linestyle=":",
                   label=f"tree of every request ({memory['used_bytes'] / 1e6:.3g} MB)")
    ax_mem.set_ylabel("index memory (MB)")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="lower right", fontsize=8)
    positive = caps[caps > 0]
    log = positive.size == caps.size >= 2 and positive.max() / positive.min() > 10
    if log:
        ax_mem.set_xscale("log")
    # ticks at the capacities swept (thinned to fit), no minor labels
    ticks = list(caps)
    step = max(1, -(-len(ticks) // 8))
    ax_mem.xaxis.set_major_locator(FixedLocator(ticks[::step]))
    ax_mem.xaxis.set_major_formatter(FuncFormatter(compact_number))
    ax_mem.xaxis.set_minor_locator(NullLocator())
    ax_mem.xaxis.set_minor_formatter(NullFormatter())
    ax_mem.set_xlabel(x_label)
    for ax in (ax_hit, ax_req, ax_mem):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_cluster_figure(sweep_result, x_label, title):
    """The cluster study as a matplotlib ``Figure``: share of prefill saved
    (top) and load imbalance (bottom) against capacity, one line per
    (workers, router)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6.5))
    ax_hit, ax_imb = fig.subplots(2, 1, sharex=True)
    groups = {}
    for r in sweep_result.results:
        groups.setdefault((r.workers, r.router), []).append(r)
    for (w, name), rs_ in groups.items():
        pts = sorted((r.capacity, r) for r in rs_ if r.capacity is not None)
        if not pts:
            continue
        x = [c for c, _ in pts]
        ax_hit.plot(x, [r.prefill_saved_fraction for _, r in pts], marker="o", ms=3,
                    label=f"{w} x {name}")
        ax_imb.plot(x, [r.load_imbalance for _, r in pts], marker="o", ms=3)
    ax_hit.set_ylabel("prefill saved")
    ax_imb.set_ylabel("load imbalance (max / mean busy time)")
    ax_imb.set_xlabel(x_label)
    ax_hit.legend(fontsize=7, ncol=2)
    for ax in (ax_hit, ax_imb):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
