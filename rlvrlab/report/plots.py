"""PNG plots: training curves (mean and 95% Student-t band over seeds per step), pass@k curves over k with crossed
(seeds x problems) bands, pass@k and coverage@k over k = 1..64 (rlvrlab.report.passk_curve), and a
sweep's heatmap of the objective over two swept keys with the best cell marked."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional

import numpy as np

from rlvrlab import outputs, stats
from rlvrlab.report.collect import EvalRecords, Selection, curves


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def training_curves(client, selection: Selection, metric: str, out: Path, smooth: int = 1) -> Path:
    plt = _pyplot()
    many = len(selection.groups) > 8
    fig, ax = plt.subplots(figsize=(11 if many else 7, 4.2 + 0.12 * max(0, len(selection.groups) - 20)))
    if many:
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
    for g in selection.groups:
        steps, values = curves(client, g, metric)
        if values.size == 0:
            continue
        if smooth > 1:  # a trailing moving average per seed, before the band
            values = np.asarray([_trailing_mean(v, smooth) for v in values])
        mean, low, high = stats.curve_band(values)
        line, = ax.plot(steps, mean, label=f"{g.label} (n={len(g.runs)})", linewidth=1.4)
        if len(g.runs) >= stats.MIN_SEEDS:
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean over seeds, 95% t-band" + (f" (moving average {smooth})" if smooth > 1
                                                                      else ""), fontsize=10)
    ax.grid(alpha=0.3)
    if many:  # beside the axes, not over the curves
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=7, loc="best")
    return _save(fig, out / f"curve_{_slug(metric)}.png")


def passk_curves(selection: Selection, evals: EvalRecords, dataset: str, out: Path) -> Optional[Path]:
    ks = sorted(int(s.split("@")[1]) for s in evals.statistics if s.startswith("pass@"))
    if not ks:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for g in selection.groups:
        means, lows, highs = [], [], []
        for k in ks:
            x = evals.matrices[(g.label, dataset, f"pass@{k}")]
            if len(g.runs) >= stats.MIN_SEEDS:
                interval = stats.crossed_interval(x)
                mean, low, high = interval.mean, interval.low, interval.high
            else:
                mean, low, high = float(x.mean()), math.nan, math.nan
            means.append(mean)
            lows.append(low)
            highs.append(high)
        line, = ax.plot(ks, means, marker="o", markersize=3, label=f"{g.label} (n={len(g.runs)})")
        if not any(math.isnan(v) for v in lows):
            ax.fill_between(ks, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(f"{dataset}: unbiased pass@k, 95% band over seeds and problems", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, out / f"passk_{_slug(dataset)}.png")


def passk_coverage_curves(points, dataset: str, out: Path, note: Optional[str] = None) -> Path:
    """passk_curve_<dataset>.png: pass@k and coverage@k over k (rlvrlab.report.passk_curve's CurvePoints of one
    dataset), side by side, mean over seeds and problems with the crossed 95% band where a group has 2 seeds."""
    plt = _pyplot()
    shown = [m for m in ("pass_at_k", "coverage_at_k") if any(p.metric == m for p in points)]  # coverage@k needs the
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4.4 if note else 4.2), squeeze=False)
    axes = list(axes[0])  # correct set's size: tasks that cannot list their answers have pass@k only
    groups = list(dict.fromkeys(p.group for p in points))
    estimate = " / ".join(sorted({p.estimate for p in points}))
    titles = {"pass_at_k": f"{dataset}: pass@k ({estimate}), 95% band over seeds and problems",
              "coverage_at_k": f"{dataset}: coverage@k, expected share of the correct set in k samples"}
    for ax, metric in zip(axes, shown):
        name = {"pass_at_k": "pass@k", "coverage_at_k": "coverage@k"}[metric]
        for group in groups:
            mine = sorted((p for p in points if p.group == group and p.metric == metric), key=lambda p: p.k)
            if not mine:
                continue
            ks = [p.k for p in mine]
            line, = ax.plot(ks, [p.mean for p in mine], label=f"{group} (n={mine[0].n_seeds})", linewidth=1.4)
            if not any(math.isnan(p.ci_low) or math.isnan(p.ci_high) for p in mine):
                ax.fill_between(ks, [p.ci_low for p in mine], [p.ci_high for p in mine], color=line.get_color(),
                                alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        top = max((p.k for p in points), default=1)
        ticks = [2 ** i for i in range(top.bit_length()) if 2 ** i <= top]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(k) for k in ticks])
        ax.set_xlabel("k")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(titles[metric], fontsize=9)
    if note:
        fig.text(0.01, 0.01, note, fontsize=6.5, ha="left", va="bottom")
    return _save(fig, out / f"passk_curve_{_slug(dataset)}.png", rect=(0, 0.05 if note else 0, 1, 1))


def heatmap(selection: Selection, values: dict[str, float], keys: tuple[str, str], metric: str, out: Path,
            higher_is_better: bool) -> Path:
    """values: group label -> the objective mean. Other swept keys are held at the best cell's values."""
    from rlvrlab.errors import RlvrlabError

    groups = {g.label: g for g in selection.groups}
    params = {label: groups[label].runs[0].params for label in values}
    for key in keys:
        if not all(key in p for p in params.values()):
            raise RlvrlabError(f"--heatmap key {key!r} is not a config key of the runs; swept keys: "
                               f"{', '.join(selection.swept) or 'none'}")
    sign = 1 if higher_is_better else -1
    best_label = max(values, key=lambda label: sign * values[label])
    others = [k for k in selection.swept if k not in keys]
    fixed = {k: params[best_label].get(k) for k in others}
    cells = {label: v for label, v in values.items() if all(params[label].get(k) == fixed[k] for k in others)}
    rows = sorted({params[label][keys[0]] for label in cells}, key=_sort_key)
    cols = sorted({params[label][keys[1]] for label in cells}, key=_sort_key)
    grid = np.full((len(rows), len(cols)), np.nan)
    for label, v in cells.items():
        grid[rows.index(params[label][keys[0]]), cols.index(params[label][keys[1]])] = v
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.3 * len(cols) + 2.5, 1.0 * len(rows) + 1.8))
    image = ax.imshow(grid, cmap="viridis" if higher_is_better else "viridis_r", aspect="auto")
    fig.colorbar(image, ax=ax, label=metric)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(keys[1])
    ax.set_ylabel(keys[0])
    for i in range(len(rows)):
        for j in range(len(cols)):
            if not math.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=8,
                        color="white" if (grid[i, j] - np.nanmin(grid)) < 0.5 * np.ptp(grid[~np.isnan(grid)])
                        else "black")
    bi = rows.index(params[best_label][keys[0]])
    bj = cols.index(params[best_label][keys[1]])
    ax.add_patch(plt.Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    held = ", ".join(f"{k}={v}" for k, v in fixed.items())
    ax.set_title(f"{metric} (mean over seeds); best cell boxed" + (f"\nheld at the best: {held}" if held else ""),
                 fontsize=9)
    return _save(fig, out / f"heatmap_{_slug(keys[0])}_{_slug(keys[1])}.png")


def interaction_maps(report, out: Path) -> list[Path]:
    """--interaction A,B: interaction_<A>_<B>.png per pair with rows (rlvrlab.report.table.InteractionRow)."""
    pairs = dict.fromkeys(r.keys for r in report.interactions or [])
    return [interaction_map([r for r in report.interactions if r.keys == keys], out) for keys in pairs]


def interaction_map(rows: list, out: Path) -> Path:
    """One pair's map, a panel per stratum of its first column: each (A, B) cell's Δ against the grid's reference
    cell (a0, b0) with its 95% paired t half-width, and a mask: a cell whose interaction contrast has Holm p < 0.05
    is boxed in red and starred (B's effect there differs from B's effect at a0)."""
    column = (rows[0].section, rows[0].metric)
    grids = list({id(r.grid): r.grid for r in rows if (r.section, r.metric) == column}.values())
    marked = {(id(r.grid), r.contrast.i, r.contrast.j) for r in rows if r.significant}
    a_key, b_key = rows[0].keys
    plt = _pyplot()
    first = grids[0]
    fig, axes = plt.subplots(1, len(grids), figsize=((1.6 * len(first.b_levels) + 1.8) * len(grids),
                                                     1.1 * len(first.a_levels) + 2.0), squeeze=False)
    for ax, grid in zip(axes[0], grids):
        d = grid.y - grid.y[:, :1, :1]
        delta = d.mean(axis=0)
        half = stats.t_ppf(0.975, d.shape[0] - 1) * d.std(axis=0, ddof=1) / math.sqrt(d.shape[0])
        limit = float(np.max(np.abs(delta))) or 1.0
        ax.imshow(delta, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_xticks(range(len(grid.b_levels)), grid.b_levels)
        ax.set_yticks(range(len(grid.a_levels)), grid.a_levels)
        ax.set_xlabel(b_key)
        ax.set_ylabel(a_key)
        for i in range(delta.shape[0]):
            for j in range(delta.shape[1]):
                star = "*" if (id(grid), i, j) in marked else ""
                text = "ref" if i == j == 0 else f"{delta[i, j]:+.3f}{star}\n±{half[i, j]:.3f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if abs(delta[i, j]) > 0.6 * limit else "black")
                if star:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_title((grid.stratum or "all cells") + f" ({len(grid.seeds)} seeds)", fontsize=8)
    fig.suptitle(f"{column[1]}: Δ vs ({a_key}={first.a_levels[0]}, {b_key}={first.b_levels[0]}) ± 95% paired t; "
                 "boxed *: interaction Holm p < 0.05; exploratory", fontsize=8)
    return _save(fig, out / f"interaction_{_slug(a_key)}_{_slug(b_key)}.png")


def _trailing_mean(v: np.ndarray, window: int) -> np.ndarray:
    """out[t] = mean(v[max(0, t - window + 1) : t + 1])"""
    c = np.concatenate([[0.0], np.cumsum(v)])
    t = np.arange(len(v))
    start = np.maximum(0, t - window + 1)
    return (c[t + 1] - c[start]) / (t + 1 - start)


def _sort_key(value: str):
    try:
        return (0, float(value))
    except (TypeError, ValueError):
        return (1, str(value))


def _save(fig, path: Path, rect: Optional[tuple[float, float, float, float]] = None) -> Path:
    """The figure laid out (tight_layout, within `rect`) as a PNG at `path`, whole or not at all
    (rlvrlab.outputs.replacing: a full disk leaves no empty or partial file), then closed; returns `path`."""
    fig.tight_layout(rect=rect)
    with outputs.replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    _pyplot().close(fig)
    return path
