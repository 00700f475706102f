"""Figures (matplotlib, Agg backend).

Plain Python around the results; the core never imports this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (for the experiments' own figures)."""
    return plt


def save(fig, path):
    """Write ``fig`` to ``path`` as PNG (atomically: a temporary file, then a rename) and close it.

    Args:
      fig: a matplotlib Figure.
      path: the file to write.

    Returns:
      The path written.
    """
    import io

    from .io import atomic_write_bytes

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def grid_shape(n, max_cols=5):
    """The (rows, columns) of a grid of ``n`` panels: at most ``max_cols`` a row, rows as full as possible.

    Args:
      n: the number of panels.
      max_cols: the most panels a row.

    Returns:
      ``(rows, cols)`` with ``rows * cols >= n``.
    """
    n = max(int(n), 1)
    rows = -(-n // max_cols)
    return rows, -(-n // rows)


def panel_grid(n, *, max_cols=5, panel=(2.8, 2.8), projection=None, **kw):
    """A figure of ``n`` panels in a grid (:func:`grid_shape`), constrained layout; spare cells removed.

    Args:
      n: the number of panels.
      max_cols: the most panels a row.
      panel: one panel's (width, height) in inches.
      projection: the panels' projection (``"3d"`` for 3-D axes, None for 2-D).
      **kw: passed to ``plt.figure``.

    Returns:
      ``(fig, axes)``: the figure and the list of its ``n`` axes, row by row.
    """
    rows, cols = grid_shape(n, max_cols)
    fig = plt.figure(figsize=(panel[0] * cols + 1.0, panel[1] * rows + 0.6), layout="constrained",
                     **kw)
    axes = [fig.add_subplot(rows, cols, k + 1, projection=projection) for k in range(n)]
    return fig, axes


def _circle_snapshots(xs, ts, title):
    """S¹ panels: the unit circle with the particles, coloured by their angle at the first time."""
    fig, axes = panel_grid(len(ts), panel=(2.5, 2.5))
    th = np.linspace(0, 2 * np.pi, 200)
    c0 = np.arctan2(xs[0, :, 1], xs[0, :, 0])
    for k, ax in enumerate(axes):
        ax.plot(np.cos(th), np.sin(th), color="0.8", lw=1, zorder=1)
        sc = ax.scatter(xs[k, :, 0], xs[k, :, 1], s=16, c=c0, cmap="twilight", vmin=-np.pi,
                        vmax=np.pi, edgecolors="none", zorder=3)
        ax.set_xlim(-1.18, 1.18)
        ax.set_ylim(-1.18, 1.18)
        ax.set_aspect("equal")
        ax.set_axis_off()
        ax.set_title(f"t = {ts[k]:.3g}", fontsize=10)
    cb = fig.colorbar(sc, ax=axes, shrink=0.8, ticks=[-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi])
    cb.set_ticklabels(["−π", "−π/2", "0", "π/2", "π"])
    cb.set_label(f"particle's angle θ at t = {ts[0]:.3g}")
    fig.suptitle(title)
    return fig


def _globe_snapshots(xs, ts, title):
    """S² panels (first three coordinates): wire-frame spheres, particles coloured by their first x₃."""
    fig, axes = panel_grid(len(ts), max_cols=4, panel=(3.0, 3.0), projection="3d")
    u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
    c0 = xs[0, :, 2]
    for k, ax in enumerate(axes):
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                          linewidth=0.3)
        x = xs[k]
        sc = ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=2, c=c0, cmap="viridis", vmin=-1, vmax=1,
                        depthshade=False)
        ax.set_title(f"t = {ts[k]:.3g}", fontsize=10)
        ax.set_box_aspect((1, 1, 1), zoom=1.25)
        ax.set_axis_off()
    cb = fig.colorbar(sc, ax=axes, shrink=0.7)
    cb.set_label(f"particle's coordinate x₃ at t = {ts[0]:.3g}")
    if xs.shape[-1] > 3:
        title += f"  (first 3 of {xs.shape[-1]} coordinates)"
    fig.suptitle(title)
    return fig


def sphere_snapshots(xs, ts, path, title=""):
    """Particles on the sphere at several times, in a grid of panels.

    S¹ (d = 2): the unit circle in the plane (equal aspect), each particle coloured by its angle
    at the first time; S² (d = 3; d > 3: the first three coordinates): wire-frame spheres, each
    particle coloured by its third coordinate at the first time. A colour bar says so.

    Args:
      xs: (T, N, d) particles, d >= 2.
      ts: (T,) their times.
      path: the PNG to write.
      title: the figure's title.

    Returns:
      The path written.
    """
    xs = np.asarray(xs)
    ts = np.asarray(ts)
    fig = _circle_snapshots(xs, ts, title) if xs.shape[-1] == 2 else _globe_snapshots(xs, ts, title)
    return save(fig, path)


def ellipse(ax, m, S, **kw):
    """The 2σ ellipse ``{m + 2 S^{1/2} u : |u| = 1}`` of a 2×2 covariance S, drawn on ``ax``."""
    w, u = np.linalg.eigh(0.5 * (S + S.T))
    th = np.linspace(0, 2 * np.pi, 100)
    circ = np.stack([np.cos(th), np.sin(th)])
    pts = m[:, None] + 2.0 * (u * np.sqrt(np.maximum(w, 0))) @ circ
    ax.plot(pts[0], pts[1], **kw)


@dataclasses.dataclass(frozen=True)
class Axes:
    """Labels and scales of one plot.

    Attributes:
      xlabel: the x axis's label.
      ylabel: the y axis's label.
      title: the title.
      logx: a logarithmic x axis.
      logy: a logarithmic y axis.
      title_size: the title's font size (None: matplotlib's).
    """

    xlabel: str = ""
    ylabel: str = ""
    title: str = ""
    logx: bool = False
    logy: bool = False
    title_size: float | None = None

    def apply(self, ax):
        """Label and scale ``ax``, with a light grid.

        Args:
          ax: a matplotlib Axes.
        """
        if self.logx:
            ax.set_xscale("log")
        if self.logy:
            ax.set_yscale("log")
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        ax.set_title(self.title, **({} if self.title_size is None else {"fontsize": self.title_size}))
        ax.grid(alpha=0.3)


def legend_outside(ax, **kw):
    """A legend to the right of ``ax``, outside the plotting area (it never covers data).

    Args:
      ax: a matplotlib Axes.
      **kw: passed to ``ax.legend`` (e.g. ``handles``, ``labels``, ``ncol``, ``fontsize``).

    Returns:
      The legend.
    """
    return ax.legend(**{"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.02, 1.0),
                        "borderaxespad": 0.0, **kw})


def curves(x, ys: dict, path, *, reference: dict | None = None, cmap="viridis", **labels):
    """One curve per entry of ``ys``, coloured along a colormap, with dashed reference curves.

    The legend stands to the right of the axes.

    Args:
      x: the abscissae.
      ys: label → ordinates, or a 2-D array of several runs of that label (one a row, drawn
        thin in the label's colour).
      path: the PNG to write.
      reference: label → ``(x, y)`` of dashed reference curves.
      cmap: the colormap.
      **labels: the fields of :class:`Axes` (``xlabel``, ``ylabel``, ``title``, ``logx``, ``logy``).

    Returns:
      The path written.
    """
    axes = Axes(**labels)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.get_cmap(cmap)(np.linspace(0.05, 0.9, max(len(ys), 1)))
    for (label, y), c in zip(ys.items(), colors):
        y = np.asarray(y)
        if y.ndim == 2:
            for j, row in enumerate(y):
                ax.plot(x, row, color=c, lw=1.0, alpha=0.8, label=label if j == 0 else None)
        else:
            ax.plot(x, y, color=c, label=label, lw=1.6)
    for label, (xr, yr) in (reference or {}).items():
        ax.plot(xr, yr, "k--", lw=1.2, label=label)
    axes.apply(ax)
    n = len(ys) + len(reference or {})
    legend_outside(ax, ncol=2 if n > 16 else 1)
    return save(fig, path)


def scatter_fit(x, y, path, *, reference=None, line=False, **labels):
    """Points with, optionally, a least-squares line (in the plotted axes) and a reference curve.

    Args:
      x: the abscissae.
      y: the ordinates.
      path: the PNG to write.
      reference: ``(x, y, label)`` of a dashed reference curve.
      line: draw the least-squares line (on the log scales where the axes are logarithmic).
      **labels: the fields of :class:`Axes`.

    Returns:
      The path written.
    """
    axes = Axes(**{"title_size": 10, **labels})
    x, y = np.asarray(x, float), np.asarray(y, float)
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    ax.plot(x, y, "o", color="C0", label="measured")
    ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if axes.logy else True) & ((x > 0) if axes.logx else True)
    if line and ok.sum() >= 2:
        fx = np.log(x[ok]) if axes.logx else x[ok]
        fy = np.log(y[ok]) if axes.logy else y[ok]
        s, c = np.polyfit(fx, fy, 1)
        xs = np.linspace(fx.min(), fx.max(), 50)
        ax.plot(np.exp(xs) if axes.logx else xs, np.exp(s * xs + c) if axes.logy else s * xs + c, "C0-",
                alpha=0.6, label=f"fit, slope {s:.3g}")
    if reference is not None:
        rx, ry, rl = reference
        ax.plot(rx, ry, "k--", label=rl)
    axes.apply(ax)
    ax.legend(fontsize=8)
    return save(fig, path)


def mass_fractions(t, betas, mass_E, mass_V, path, *, angle, title=""):
    """Mass near E(VBᵀ) (solid) and near E(V) (dashed) against t, one colour per β.

    The legend stands to the right of the axes.

    Args:
      t: the times.
      betas: the β values.
      mass_E: (len(betas), len(t)) fractions of the mass within ``angle`` of E(VBᵀ).
      mass_V: (len(betas), len(t)) fractions of the mass within ``angle`` of E(V).
      path: the PNG to write.
      angle: the angle (degrees) of "near".
      title: the run's name, for the title.

    Returns:
      The path written.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.get_cmap("viridis")(np.linspace(0.05, 0.9, max(len(betas), 1)))
    for b, e, v, c in zip(betas, mass_E, mass_V, colors):
        ax.plot(t, e, color=c, lw=1.6, label=f"β = {b:g}")
        ax.plot(t, v, color=c, lw=1.2, ls="--")
    ax.plot([], [], "k-", label=f"within {angle:g}° of E(VBᵀ)")
    ax.plot([], [], "k--", label=f"within {angle:g}° of E(V)")
    ax.set_xlabel("t (depth)")
    ax.set_ylabel("mass fraction")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{title}: where the mass sits")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    return save(fig, path)


def cell_edges(v):
    """Edges of heat-map cells centred on the sorted values ``v`` (midpoints; half a step beyond the ends).

    Args:
      v: (n,) increasing values.

    Returns:
      (n + 1,) edges; one value ``v0`` gets the cell ``[v0 − ½, v0 + ½]``.
    """
    v = np.asarray(v, float)
    if v.size == 1:
        return np.array([v[0] - 0.5, v[0] + 0.5])
    mid = 0.5 * (v[1:] + v[:-1])
    return np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])


def span_data(ax, v, axis="x"):
    """Limit one axis of ``ax`` to the data range of ``v`` (its first to its last value).

    A single value gets ``v0 ± ½``.

    Args:
      ax: a matplotlib Axes.
      v: the values along that axis (sorted).
      axis: ``"x"`` or ``"y"``.
    """
    v = np.asarray(v, float)
    lo, hi = (v[0], v[-1]) if v.size > 1 and v[-1] != v[0] else (v[0] - 0.5, v[0] + 0.5)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(min(lo, hi), max(lo, hi))


def _even_indices(n, most):
    """At most ``most`` indices of ``0 … n−1`` at one stride, the first and the last included.

    The stride divides n − 1 where one at most twice the smallest admissible does; else the
    last index is added (or replaces the final stride point when that one is closer than half
    a stride, or when adding would exceed ``most``).

    Args:
      n: the number of rows.
      most: the most indices.

    Returns:
      The increasing indices.
    """
    if n <= most:
        return list(range(n))
    low = -(-(n - 1) // (most - 1))
    for step in range(low, 2 * low + 1):
        if (n - 1) % step == 0:
            return list(range(0, n, step))
    idx = list(range(0, n, low))
    if n - 1 - idx[-1] < low / 2 or len(idx) == most:
        idx[-1] = n - 1
    else:
        idx.append(n - 1)
    return idx


def value_ticks(ax, values, axis="y", max_ticks=9):
    """Rows (or columns) ``0 … n−1`` of a heat map labelled with their values.

    At most ``max_ticks`` labels (every k-th row, always the first and the last value); the axis
    spans the n rows exactly (``−½ … n − ½``).

    Args:
      ax: a matplotlib Axes.
      values: (n,) the value of each row.
      axis: ``"y"`` (rows) or ``"x"`` (columns).
      max_ticks: the most labelled ticks.
    """
    values = np.asarray(values, float)
    n = values.size
    idx = _even_indices(n, max_ticks)
    texts = [f"{values[i]:.3g}" for i in idx]
    if axis == "y":
        ax.set_yticks(idx, texts)
        ax.set_ylim(-0.5, n - 0.5)
    else:
        ax.set_xticks(idx, texts)
        ax.set_xlim(-0.5, n - 0.5)


def log_value_ticks(ax, values, axis="x", max_ticks=9):
    """A logarithmic axis with its major ticks at the (distinct) ``values``, labelled plainly.

    At most ``max_ticks`` labels (spread evenly over the sorted values, always the first and the
    last); no minor tick labels.

    Args:
      ax: a matplotlib Axes.
      values: the values to mark (positive).
      axis: ``"x"`` or ``"y"``.
      max_ticks: the most labelled ticks.
    """
    from matplotlib.ticker import NullFormatter

    v = np.unique(np.asarray(values, float))
    v = v[np.isfinite(v) & (v > 0)]
    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    if v.size == 0:
        return
    idx = np.unique(np.round(np.linspace(0, v.size - 1, min(v.size, max_ticks))).astype(int))
    which.set_ticks(v[idx], [f"{x:g}" for x in v[idx]])
    which.set_minor_formatter(NullFormatter())


def heatmaps(x, y, panels: dict, path, *, cbar_labels=None, log_panels=(), **labels):
    """One heat map a panel, side by side.

    The x axis spans the data (cells centred on the values); the rows are the values of ``y``,
    equally tall, with ticks labelled by those values (so two β or fifty, linear or geometric
    sweeps, every row is one value and the axis names no value outside them).

    Args:
      x: the grid's abscissae (e.g. t across), increasing.
      y: the grid's ordinates (e.g. β up, as the rotf phase diagrams), increasing.
      panels: a panel title → a (len(y), len(x)) array.
      path: the PNG to write.
      cbar_labels: each panel's colour-bar label.
      log_panels: indices of the panels with a logarithmic colour scale (positive data).
      **labels: ``xlabel``, ``ylabel`` (every panel) and ``title`` (the figure's).

    Returns:
      The path written.
    """
    from matplotlib.colors import LogNorm

    title = labels.pop("title", "")
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    k = len(panels)
    fig, axes = plt.subplots(1, k, figsize=(5.2 * k, 4.2), squeeze=False, layout="constrained")
    xe = cell_edges(x)
    ye = np.arange(y.size + 1) - 0.5
    for i, (name, z) in enumerate(panels.items()):
        ax = axes[0, i]
        z = np.asarray(z)
        norm = LogNorm(vmin=np.nanmin(z), vmax=np.nanmax(z)) if i in log_panels else None
        mesh = ax.pcolormesh(xe, ye, z, shading="flat", cmap="viridis", norm=norm)
        cb = fig.colorbar(mesh, ax=ax)
        if cbar_labels:
            cb.set_label(cbar_labels[i])
        Axes(**labels, title=name, title_size=10).apply(ax)
        ax.grid(False)
        span_data(ax, x, "x")
        value_ticks(ax, y, "y")
    if title:
        fig.suptitle(title)
    return save(fig, path)


def _circle_frames(xs, ts, title, c, cmap, lim):
    """The S¹ movie's figure: the unit circle, the particles of the first frame on it.

    Returns:
      ``(fig, ax, scatter, draw)``, ``draw(k)`` moving the particles to frame k.
    """
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    th = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(th), np.sin(th), color="0.8", lw=1)
    sc = ax.scatter(xs[0, :, 0], xs[0, :, 1], s=18, c=c, cmap=cmap, vmin=lim[0], vmax=lim[1],
                    zorder=3)
    ax.set_xlim(-1.15, 1.15)
    ax.set_ylim(-1.15, 1.15)
    ax.set_aspect("equal")
    ax.set_axis_off()

    def draw(k):
        sc.set_offsets(xs[k, :, :2])
        ax.set_title(f"{title}  t = {ts[k]:.3g}".strip())
        return (sc,)

    return fig, ax, sc, draw


def _sphere_frames(xs, ts, title, c, cmap, lim):
    """The S² movie's figure: a wire-frame sphere, the particles of the first frame on it.

    Returns:
      ``(fig, ax, scatter, draw)``, ``draw(k)`` moving the particles to frame k.
    """
    fig = plt.figure(figsize=(5.6, 4.6))
    ax = fig.add_subplot(projection="3d")
    u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                      linewidth=0.3)
    x0 = xs[0]
    sc = ax.scatter(x0[:, 0], x0[:, 1], x0[:, 2], s=4, c=c, cmap=cmap, vmin=lim[0],
                    vmax=lim[1], depthshade=False)
    ax.set_box_aspect((1, 1, 1))
    ax.set_axis_off()

    def draw(k):
        sc.set_offsets(xs[k, :, :2])
        sc.set_3d_properties(xs[k, :, 2], "z")
        ax.set_title(f"{title}  t = {ts[k]:.3g}".strip())
        return (sc,)

    return fig, ax, sc, draw


def particle_movie(xs, ts, path, *, title="", fps=8, colors=None, color_label=None):
    """An animation of saved particles: ``xs`` (S, N, d), one frame per saved time ``ts``.

    S¹ (d = 2) is drawn as the unit circle with the particles on it; S² (d = 3) as a
    wire-frame sphere (d > 3: the first three coordinates). The particles keep one colour each,
    by default their angle (S¹) or third coordinate (S²) in the first frame, and a colour bar
    says what the colour encodes. The format follows the suffix of
    ``path``: ``.gif`` (pillow, always available with matplotlib) or ``.mp4`` (needs the
    ``ffmpeg`` program; without it a ``.gif`` is written beside and its path returned).

    Args:
      xs: (S, N, d) saved particles, d >= 2.
      ts: (S,) their times.
      path: the file to write (``.gif`` or ``.mp4``).
      title: the frames' title (the time is appended).
      fps: frames per second.
      colors: one colour value in [0, 1] a particle (default: by the first frame, as above).
      color_label: the colour bar's label for ``colors`` (None: no colour bar for them).

    Returns:
      The path written.

    Raises:
      ValueError: ``xs`` and ``ts`` of the wrong shapes.
    """
    from matplotlib import animation

    xs = np.asarray(xs)
    ts = np.asarray(ts)
    if xs.ndim != 3 or xs.shape[0] != ts.shape[0] or xs.shape[-1] < 2:
        raise ValueError(f"particle_movie needs xs of shape (S, N, d >= 2) and ts of shape (S,), "
                         f"got {xs.shape} and {ts.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d = xs.shape[-1]
    if colors is not None:
        c, cmap, lim, label = colors, "viridis", (0, 1), color_label
    elif d == 2:
        c, cmap, lim = np.arctan2(xs[0, :, 1], xs[0, :, 0]), "twilight", (-np.pi, np.pi)
        label = f"particle's angle θ at t = {ts[0]:.3g}"
    else:
        c, cmap, lim, label = xs[0, :, 2], "viridis", (-1, 1), f"particle's x₃ at t = {ts[0]:.3g}"
    frames = _circle_frames if d == 2 else _sphere_frames
    fig, ax, sc, draw = frames(xs, ts, title, c, cmap, lim)
    if label:
        cb = fig.colorbar(sc, ax=ax, shrink=0.7, label=label)
        if lim == (-np.pi, np.pi):
            cb.set_ticks([-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi], labels=["−π", "−π/2", "0", "π/2", "π"])
    anim = animation.FuncAnimation(fig, draw, frames=len(ts), blit=False)
    if path.suffix == ".mp4" and animation.writers.is_available("ffmpeg"):
        writer = animation.FFMpegWriter(fps=fps)
    else:
        path = path.with_suffix(".gif")
        writer = animation.PillowWriter(fps=fps)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    anim.save(tmp, writer=writer)
    plt.close(fig)
    tmp.replace(path)
    return path
