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


def sphere_snapshots(xs, ts, path, title=""):
    """Particles on S² at several times: xs (T, N, d); d > 3 shows the first 3 coordinates."""
    T = xs.shape[0]
    fig = plt.figure(figsize=(3.3 * T, 3.6))
    u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
    for k in range(T):
        ax = fig.add_subplot(1, T, k + 1, projection="3d")
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                          linewidth=0.3)
        x = xs[k]
        if x.shape[1] == 2:
            x = np.concatenate([x, np.zeros((x.shape[0], 1))], axis=1)
        c = x[:, 2] if x.shape[1] > 2 else None
        ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=2, c=c, cmap="viridis", vmin=-1, vmax=1,
                   depthshade=False)
        ax.set_title(f"t = {ts[k]:.3g}")
        ax.set_box_aspect((1, 1, 1))
        ax.set_axis_off()
    if xs.shape[-1] > 3:
        title += f"  (first 3 of {xs.shape[-1]} coordinates)"
    fig.suptitle(title)
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


def curves(x, ys: dict, path, *, reference: dict | None = None, cmap="viridis", **labels):
    """One curve per entry of ``ys``, coloured along a colormap, with dashed reference curves.

    Args:
      x: the abscissae.
      ys: label → ordinates.
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
        ax.plot(x, y, color=c, label=label, lw=1.6)
    for label, (xr, yr) in (reference or {}).items():
        ax.plot(xr, yr, "k--", lw=1.2, label=label)
    axes.apply(ax)
    ax.legend(fontsize=7, ncol=2 if len(ys) > 6 else 1)
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
    """Mass near E(VBᵀ) (solid) and near E(V) (dashed) against t, one colour per β."""
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
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def heatmaps(x, y, panels: dict, path, *, cbar_labels=None, log_panels=(), **labels):
    """One heat map a panel, side by side.

    Args:
      x: the grid's abscissae (e.g. t across).
      y: the grid's ordinates (e.g. β up, as the rotf phase diagrams).
      panels: a panel title → a (len(y), len(x)) array drawn with ``pcolormesh``.
      path: the PNG to write.
      cbar_labels: each panel's colour-bar label.
      log_panels: indices of the panels with a logarithmic colour scale (positive data).
      **labels: ``xlabel``, ``ylabel`` (every panel) and ``title`` (the figure's).

    Returns:
      The path written.
    """
    from matplotlib.colors import LogNorm

    title = labels.pop("title", "")
    k = len(panels)
    fig, axes = plt.subplots(1, k, figsize=(5.2 * k, 4.0), squeeze=False)
    for i, (name, z) in enumerate(panels.items()):
        ax = axes[0, i]
        z = np.asarray(z)
        norm = LogNorm(vmin=np.nanmin(z), vmax=np.nanmax(z)) if i in log_panels else None
        mesh = ax.pcolormesh(np.asarray(x), np.asarray(y), z, shading="nearest",
                             cmap="viridis", norm=norm)
        cb = fig.colorbar(mesh, ax=ax)
        if cbar_labels:
            cb.set_label(cbar_labels[i])
        Axes(**labels, title=name).apply(ax)
        ax.grid(False)
    if title:
        fig.suptitle(title)
    return save(fig, path)


def particle_movie(xs, ts, path, *, title="", fps=8, colors=None):
    """An animation of saved particles: ``xs`` (S, N, d), one frame per saved time ``ts``.

    S¹ (d = 2) is drawn as the unit circle with the particles on it; S² (d = 3) as a
    wire-frame sphere (d > 3: the first three coordinates). The format follows the suffix of
    ``path``: ``.gif`` (pillow, always available with matplotlib) or ``.mp4`` (needs the
    ``ffmpeg`` program; without it a ``.gif`` is written beside and its path returned).

    Args:
      xs: (S, N, d) saved particles, d >= 2.
      ts: (S,) their times.
      path: the file to write (``.gif`` or ``.mp4``).
      title: the frames' title (the time is appended).
      fps: frames per second.
      colors: one colour value in [0, 1] a particle (default: by index).

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
    c = colors if colors is not None else np.linspace(0, 1, xs.shape[1])
    if d == 2:
        fig, ax = plt.subplots(figsize=(4.2, 4.4))
        th = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(th), np.sin(th), color="0.8", lw=1)
        sc = ax.scatter(xs[0, :, 0], xs[0, :, 1], s=18, c=c, cmap="viridis", vmin=0, vmax=1,
                        zorder=3)
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_aspect("equal")
        ax.set_axis_off()

        def draw(k):
            sc.set_offsets(xs[k, :, :2])
            ax.set_title(f"{title}  t = {ts[k]:.3g}".strip())
            return (sc,)
    else:
        fig = plt.figure(figsize=(4.6, 4.6))
        ax = fig.add_subplot(projection="3d")
        u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                          linewidth=0.3)
        x0 = xs[0]
        sc = ax.scatter(x0[:, 0], x0[:, 1], x0[:, 2], s=4, c=c, cmap="viridis", vmin=0, vmax=1,
                        depthshade=False)
        ax.set_box_aspect((1, 1, 1))
        ax.set_axis_off()

        def draw(k):
            sc.set_offsets(xs[k, :, :2])
            sc.set_3d_properties(xs[k, :, 2], "z")
            ax.set_title(f"{title}  t = {ts[k]:.3g}".strip())
            return (sc,)

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
