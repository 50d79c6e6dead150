"""A picture of a parity report: each intermediate's max abs difference, in execution order,
on a log scale, against the tolerance. Where a bug enters, the curve jumps and stays up.

Drawn with matplotlib's object API on an Agg canvas (no pyplot, no global backend), so it
works without a display and does not change the caller's matplotlib state.
"""

import io
import math
from pathlib import Path

from flaxformer_mini.files import write_atomic

# Exact agreement (a difference of 0.0) has no place on a log axis: drawn at this floor.
ZERO_FLOOR = 1e-12
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
_INCHES_PER_ROW, _MIN_WIDTH, _MAX_WIDTH = 0.12, 8.0, 16.0
_LABEL_SPACING = 0.14  # inches between two landmark labels (fontsize 7, rotated)


def _values(rows):
    # inf (a missing or reshaped tensor) is drawn at the top of the axis, marked apart.
    return [max(r.max_abs, ZERO_FLOOR) if math.isfinite(r.max_abs) else math.nan for r in rows]


def _spaced_landmarks(rows, width):
    """Landmark positions to label, none closer than a label's width to another: the blocks,
    embeddings and logits first, then the encoder and decoder outputs where there is room
    (each repeats the row just before it)."""
    gap = max(1, math.ceil(_LABEL_SPACING / (0.9 * width / max(len(rows), 1))))
    secondary = {"encoder", "decoder", "decoder.fc"}
    candidates = [x for x in reversed(range(len(rows))) if rows[x].landmark]
    kept = []
    for x in sorted(candidates, key=lambda x: rows[x].name in secondary):  # stable: last first
        if all(abs(x - k) >= gap for k in kept):
            kept.append(x)
    return sorted(kept)


def _panel(ax, rows, atol, what, label_landmarks, width):
    xs = list(range(len(rows)))
    ys = _values(rows)
    ax.set_yscale("log")
    ax.plot(xs, ys, "-", color="0.6", linewidth=0.8, zorder=1)
    ok = [(x, y) for x, y, r in zip(xs, ys, rows) if r.ok and 0 < r.max_abs <= atol]
    by_f64 = [(x, y) for x, y, r in zip(xs, ys, rows) if r.ok and r.max_abs > atol]  # --float64-reference
    zero = [(x, y) for x, y, r in zip(xs, ys, rows) if r.ok and r.max_abs == 0]
    bad = [(x, y) for x, y, r in zip(xs, ys, rows) if not r.ok and math.isfinite(r.max_abs)]
    if ok:
        ax.scatter(*zip(*ok), s=12, color="tab:blue", zorder=2, label=f"{what} within tolerance")
    if by_f64:
        ax.scatter(*zip(*by_f64), s=16, color="tab:orange", zorder=2,
                   label=f"{what} beyond it, as exact as torch against float64")
    if zero:
        ax.scatter(*zip(*zero), s=12, color="tab:green", zorder=2,
                   label=f"exactly equal (0, drawn at {ZERO_FLOOR:g})")
    if bad:
        ax.scatter(*zip(*bad), s=20, color="tab:red", zorder=3, label=f"{what} beyond tolerance")
    missing = [x for x, r in zip(xs, rows) if not math.isfinite(r.max_abs)]
    for i, x in enumerate(missing):
        ax.axvline(x, color="tab:red", linestyle=":", label="missing or shape differs" if i == 0 else None)
    ax.axhline(atol, color="tab:red", linestyle="--", linewidth=1, label=f"tolerance {atol:g}")
    first = next((x for x, r in zip(xs, rows) if not r.ok), None)
    if first is not None:
        ax.annotate(f"first divergence:\n{rows[first].label}", (first, ys[first] if math.isfinite(ys[first]) else atol),
                    xytext=(10, 10), textcoords="offset points", fontsize=7, color="tab:red",
                    arrowprops=dict(arrowstyle="->", color="tab:red"))
    if label_landmarks:
        ticks = _spaced_landmarks(rows, width)
        ax.set_xticks(ticks)
        ax.set_xticklabels([rows[x].label for x in ticks], rotation=60, ha="right", fontsize=7)
    else:
        ax.set_xlabel(f"{len(rows)} parameters, in torch's parameter order")
    ax.set_ylabel("max abs difference")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def plot_report(report, path, title=None, replace=True):
    """Draw ``report`` into ``path`` (.png, .svg or .pdf). Gradient rows, if any, get a second panel.
    ``replace=False``: a file at ``path`` is kept (FileExistsError), even one made while drawing."""
    path = Path(path)
    write_atomic(path, render_report(report, path, title), replace=replace)  # never a half-drawn image
    return path


def render_report(report, path, title=None):
    """The bytes of ``plot_report``'s image for ``path`` (its suffix picks the format), drawn in
    memory: a caller writing several outputs together draws first and writes once all are ready."""
    # Imported here: matplotlib takes most of a second to load, and only a plot needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--plot {path}: unknown image type {path.suffix or '(no suffix)'!r}; "
                         f"use one of {', '.join(PLOT_SUFFIXES)}")
    intermediates = [r for r in report.rows if r.kind == "intermediate"]
    grads = [r for r in report.rows if r.kind == "gradient"]
    panels = [(intermediates, "intermediate", True)] + ([(grads, "gradient", False)] if grads else [])
    width = min(_MAX_WIDTH, max(_MIN_WIDTH, _INCHES_PER_ROW * len(intermediates)))
    fig = Figure(figsize=(width, 4.5 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (rows, what, landmarks) in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        _panel(ax, rows, report.atol, what, landmarks, width)
    agreed = ("every intermediate agrees (within tolerance, or within the float64 reference)"
              if any(r.ok and r.max_abs > report.atol for r in report.rows) else "every intermediate within tolerance")
    fig.suptitle(title or (f"torch vs Flax: {agreed}" if report.ok
                           else f"torch vs Flax: first divergence at {report.first_divergence.label}"), fontsize=10)
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lower()[1:], dpi=120)
    return image.getvalue()
