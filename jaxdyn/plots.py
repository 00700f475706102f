"""Figures (matplotlib, Agg backend). Plain Python around the results; the core never
imports this module."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (for the experiments' own figures)."""
    return plt


def save(fig, path):
    """Write ``fig`` to ``path`` (atomically: a temporary file, then a rename), close it and
    return the path."""
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


def _style(ax, *, xlabel, ylabel, title, logx, logy, title_size=None):
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    ax.grid(alpha=0.3)


def curves(x, ys: dict, path, *, xlabel="", ylabel="", title="", logx=False, logy=False,
           reference: dict | None = None, cmap="viridis"):
    """One curve per entry of ``ys`` (label -> y), coloured along a colormap; optional
    dashed reference curves (label -> (x, y))."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.get_cmap(cmap)(np.linspace(0.05, 0.9, max(len(ys), 1)))
    for (label, y), c in zip(ys.items(), colors):
        ax.plot(x, y, color=c, label=label, lw=1.6)
    for label, (xr, yr) in (reference or {}).items():
        ax.plot(xr, yr, "k--", lw=1.2, label=label)
    _style(ax, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx, logy=logy)
    ax.legend(fontsize=7, ncol=2 if len(ys) > 6 else 1)
    return save(fig, path)


def scatter_fit(x, y, path, *, xlabel="", ylabel="", title="", logx=False, logy=False,
                reference=None, line=False):
    """Points with, optionally, a least-squares line (in the plotted axes) and a reference
    curve ``(x, y, label)``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    ax.plot(x, y, "o", color="C0", label="measured")
    ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if logy else True) & ((x > 0) if logx else True)
    if line and ok.sum() >= 2:
        fx = np.log(x[ok]) if logx else x[ok]
        fy = np.log(y[ok]) if logy else y[ok]
        s, c = np.polyfit(fx, fy, 1)
        xs = np.linspace(fx.min(), fx.max(), 50)
        ax.plot(np.exp(xs) if logx else xs, np.exp(s * xs + c) if logy else s * xs + c, "C0-",
                alpha=0.6, label=f"fit, slope {s:.3g}")
    if reference is not None:
        rx, ry, rl = reference
        ax.plot(rx, ry, "k--", label=rl)
    _style(ax, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx, logy=logy, title_size=10)
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


def heatmaps(x, y, panels: dict, path, *, xlabel="", ylabel="", title="", cbar_labels=None,
             log_panels=()):
    """One heat map a panel, side by side: ``panels`` maps a panel title to a (len(y), len(x))
    array drawn with ``pcolormesh`` on the grid (x, y) (e.g. t across, β up, as the rotf
    phase diagrams); ``cbar_labels`` names each panel's colour bar; panels whose index is in
    ``log_panels`` use a logarithmic colour scale (positive data)."""
    from matplotlib.colors import LogNorm

    k = len(panels)
    fig, axes = plt.subplots(1, k, figsize=(5.2 * k, 4.0), squeeze=False)
    for i, (name, z) in enumerate(panels.items()):
        ax = axes[0, i]
        z = np.asarray(z)
        norm = LogNorm(vmin=np.nanmin(z), vmax=np.nanmax(z)) if i in log_panels else None
        mesh = ax.pcolormesh(np.asarray(x), np.asarray(y), z, shading="nearest",
                             cmap="viridis", norm=norm)
        ax.grid(False)
        cb = fig.colorbar(mesh, ax=ax)
        if cbar_labels:
            cb.set_label(cbar_labels[i])
        _style(ax, xlabel=xlabel, ylabel=ylabel, title=name, logx=False, logy=False)
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
    Returns the path written.
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
            sc._offsets3d = (xs[k, :, 0], xs[k, :, 1], xs[k, :, 2])
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
