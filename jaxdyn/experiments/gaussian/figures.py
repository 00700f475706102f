"""Kind ``gaussian``: figures (ellipses, trace, error against N, parting, ReLU, phase diagram)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ... import plots
from ... import status_code
from ...gaussian import fit_slope, parting_time, predicted_exponent
from .schema import parameters
from .summary import (axis_values, closure_tilt, equilibrium_trace, error_table, error_time,
                      main_activation, relu_first_order, select, slopes_over_time, t_index)


def plot(cfg, ds, out_dir):
    """Draw the ``gaussian`` figures (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.plot`)."""
    import warnings

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _plot(cfg, ds, out_dir)


def _plot(cfg, ds, out_dir):
    out_dir = Path(out_dir)
    if cfg["study"] == "phase_diagram":
        return [_plot_phase(cfg, ds, out_dir)]
    figs = [_plot_ellipses(cfg, ds, out_dir), _plot_trace(cfg, ds, out_dir)]
    if len(axis_values(cfg, ds, "n")) >= 2:
        figs.append(_plot_error(cfg, ds, out_dir))
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    if math.isfinite(T) and T < cfg["t1"]:
        figs.append(_plot_parting(cfg, ds, out_dir, T))
    if "relu" in axis_values(cfg, ds, "activation"):
        figs.append(_plot_relu(cfg, ds, out_dir))
    return figs


def _first(ds, var, **sel):
    da = select(ds, var, **sel)
    return da.isel({k: 0 for k in da.dims if k in ("seed", "n", "activation")})


def _n_ticks(ax, ns):
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(ns))
    ax.set_xticklabels([str(int(n)) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _panel(ax, xlabel, ylabel, title=None):
    """Axis labels, an optional small title, the grid and a small legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _finish(fig, cfg, what, path):
    fig.suptitle(f"{cfg['name']}: {what}", fontsize=10)
    return plots.save(fig, path)


def _plot_ellipses(cfg, ds, out_dir):
    plt = plots.pyplot()
    ns = axis_values(cfg, ds, "n")
    acts = axis_values(cfg, ds, "activation")
    act = "identity" if "identity" in acts else acts[0]
    nmax = max(ns)
    ts = ds["t"].values
    tsn = ds["t_snapshot"].values
    xs = _first(ds, "x_snapshot", activation=act, n=nmax).values
    mp = _first(ds, "mean_particles", activation=act, n=nmax).values
    Cp = _first(ds, "cov_particles", activation=act, n=nmax).values
    mc = _first(ds, "mean_closure", activation=act, n=nmax).values
    Cc = _first(ds, "cov_closure", activation=act, n=nmax).values
    k = len(tsn)
    rows, cols = plots.grid_shape(k, max_cols=5)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[k:]:
        ax.remove()
    cmap = plt.get_cmap("viridis")
    for j, (ax, t) in enumerate(zip(axes.flat, tsn)):
        i = t_index(ds, t)
        x = xs[j]
        ax.plot(x[:, 0], x[:, 1] if x.shape[1] > 1 else np.zeros(len(x)), ".", ms=1.5,
                color="0.6", alpha=0.6, label=f"particles ({x.shape[0]} of {int(nmax)})")
        if np.all(np.isfinite(Cc[i])) and cfg["d"] >= 2:
            plots.ellipse(ax, mc[i][:2], Cc[i][:2, :2], color=cmap(t / ts[-1]), lw=2.0, label="closure 2σ")
        elif cfg["d"] >= 2:
            ax.text(0.5, 0.92, "closure blown up", transform=ax.transAxes, ha="center", color="r")
        if cfg["d"] >= 2:
            plots.ellipse(ax, mp[i][:2], Cp[i][:2, :2], color="k", ls="--", lw=1.0, label="particles 2σ")
        ax.set_title(f"t = {t:.3g}", fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{cfg['name']}: covariance ellipses, closure (colour) vs {act} particles "
                 f"(N = {int(nmax)}, first seed)" + ("; first 2 coordinates" if cfg["d"] > 2 else ""),
                 fontsize=10)
    return plots.save(fig, out_dir / "ellipses.png")


def _plot_trace(cfg, ds, out_dir):
    plt = plots.pyplot()
    ts = ds["t"].values
    fig, ax = plt.subplots(figsize=(6.6, 4.3))
    tc = np.asarray(ds["trace_closure"].values).reshape(-1, ts.size)[0]
    tf = np.asarray(ds["trace_closed_form"].values).reshape(-1, ts.size)[0]
    ax.plot(ts, tc, "k-", lw=2.2, label="closure (Dopri8)")
    if np.any(np.isfinite(tf)):
        ax.plot(ts, tf, color="orange", ls="--", lw=1.4, label="closed form Σ = P⁻¹ (V = vI)")
    ns = axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    for act, ls in (("identity", "-"), ("relu", ":")):
        if act not in axis_values(cfg, ds, "activation"):
            continue
        for n, c in zip(ns, cm):
            tp = np.asarray(select(ds, "trace_particles", activation=act, n=n).values).reshape(-1, ts.size)
            ax.plot(ts, np.nanmean(tp, axis=0), color=c, ls=ls, lw=1.1,
                    label=f"{act} particles N = {int(n)}" + (" (mean over seeds)" if tp.shape[0] > 1 else ""))
    T = float(np.asarray(ds["closure_blowup_time"].values).reshape(-1)[0])
    if math.isfinite(T):
        ax.axvline(T, color="r", ls=":", lw=1.0, label=f"closure T* = {T:.4g}")
        ax.set_yscale("log")
    eq = equilibrium_trace(cfg)
    if eq is not None:
        ax.axhline(eq, color="0.4", ls="-.", lw=1.0, label="tr Σ* (Lyapunov equilibrium)")
    ax.set_xlabel("t")
    ax.set_ylabel("tr Σ(t)")
    ax.set_title(f"{cfg['name']}: tr Σ against t", fontsize=10)
    ax.grid(alpha=0.3)
    plots.legend_outside(ax, fontsize=6)
    return plots.save(fig, out_dir / "trace.png")


def _plot_error(cfg, ds, out_dir):
    plt = plots.pyplot()
    table = error_table(cfg, ds)
    te = error_time(cfg, ds)
    fig, (ax, a2) = plt.subplots(1, 2, figsize=(11.5, 4.2), constrained_layout=True)
    for (act, (ns, errs)), c in zip(table.items(), ("C0", "C3")):
        s = fit_slope(ns, errs)
        ax.plot(ns, errs, "o-", color=c, label=f"{act} particles (fit slope {s:.3f})")
        if act == "identity":
            ok = np.isfinite(errs) & (errs > 0)
            if ok.any():
                j = np.flatnonzero(ok)[0]
                ax.plot(ns, errs[j] * np.sqrt(ns[j] / ns), "k--", lw=1.0, label="reference N^(-1/2)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _n_ticks(ax, next(iter(table.values()))[0])
    ax.set_xlabel("N (particles)")
    ax.set_ylabel(f"RMS over seeds of Bures W2 to the closure at t = {te:.3g}")
    ax.set_title("error against N", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    tilt = closure_tilt(ds)
    if "identity" in table:
        ts, sl = slopes_over_time(cfg, ds)
        a2.plot(ts, sl, "o-", ms=3, color="C0", label="fitted slope (identity particles)")
    a2.plot(ds["t"].values, predicted_exponent(tilt), "k--", lw=1.2,
            label="predicted: −min(1/2, 1/(1 + max s²))")
    a2.axvline(te, color="0.5", ls=":", lw=1.0)
    a2.set_xlabel("t")
    a2.set_ylabel("log–log slope of the error against N")
    a2.set_ylim(-0.8, 0.1)
    a2.grid(alpha=0.3)
    a3 = a2.twinx()
    a3.plot(ds["t"].values, tilt, color="C2", lw=1.0, label="tilt index s = ‖Σ^½BΣ^½‖₂")
    a3.axhline(1.0, color="C2", ls=":", lw=0.8)
    a3.set_ylabel("tilt index s(t) of the closure", color="C2")
    a3.set_yscale("log")
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a3.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")
    a2.set_title("convergence rate over time", fontsize=9)
    fig.suptitle(f"{cfg['name']}: particles vs Gaussian closure", fontsize=10)
    return plots.save(fig, out_dir / "error_vs_n.png")


def _plot_parting(cfg, ds, out_dir, T):
    plt = plots.pyplot()
    ts = ds["t"].values
    ns = axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    thr = cfg["parting_threshold"]
    act0 = main_activation(cfg, ds)
    means = []
    for n, c in zip(ns, cm):
        tp = np.asarray(select(ds, "trace_particles", activation=act0, n=n).values).reshape(-1, ts.size)
        tcl = np.asarray(select(ds, "trace_closure", activation=act0, n=n).values).reshape(-1, ts.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            a1.plot(ts, np.nanmean(tp / tcl, axis=0), color=c, lw=1.3, label=f"N = {int(n)}")
        pt = [parting_time(ts, a, b, thr) for a, b in zip(tp, tcl)]
        means.append(pt)
    a1.axhline(1 - thr, color="k", ls="--", lw=0.8, label=f"1 − {thr:g}")
    a1.axvline(T, color="r", ls=":", label=f"closure T* = {T:.4g}")
    a1.set_xlabel("t")
    a1.set_ylabel("tr Ŝ(t) / tr Σ(t)  (particles / closure)")
    a1.set_ylim(-0.05, 1.3)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    for n, pt in zip(ns, means):
        a2.plot([n] * len(pt), pt, "o", color="C0", alpha=0.5, ms=4)
    a2.plot(ns, [np.nanmean(p) for p in means], "s-", color="C0", label="parting time (mean over seeds)")
    a2.axhline(T, color="r", ls=":", label="closure T*")
    a2.set_xscale("log")
    _n_ticks(a2, ns)
    _panel(a2, "N (particles)", f"first t with |tr Ŝ/tr Σ − 1| > {thr:g}")
    return _finish(fig, cfg, "particles and closure part ways before the blow-up",
                   out_dir / "parting.png")


def _plot_relu(cfg, ds, out_dir):
    plt = plots.pyplot()
    ts = ds["t"].values
    ns = axis_values(cfg, ds, "n")
    cm = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(ns)))
    pred, _ = relu_first_order(cfg, ds)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    acts = axis_values(cfg, ds, "activation")
    for n, c in zip(ns, cm):
        for act, ls in (("relu", "-"), ("identity", ":")):
            if act not in acts:
                continue
            w = np.asarray(select(ds, "bures", activation=act, n=n).values).reshape(-1, ts.size)
            a1.plot(ts, np.nanmean(w, axis=0), color=c, ls=ls, lw=1.3,
                    label=f"{act}, N = {int(n)}")
    a1.plot(ts, pred, "k--", lw=1.2, label="first order in t (exact initial ReLU rates)")
    a1.set_yscale("log")
    a1.set_xlabel("t")
    a1.set_ylabel("Bures W2(N(m̂, Ŝ), identity closure)")
    a1.set_title("moments: ReLU cloud vs the identity closure", fontsize=9)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=6, ncol=2)
    nmax = max(ns)
    for act, ls in (("relu", "-"), ("identity", ":")):
        if act not in acts:
            continue
        sk = np.asarray(select(ds, "skew", activation=act, n=nmax).values).reshape(-1, ts.size)
        ku = np.asarray(select(ds, "kurt", activation=act, n=nmax).values).reshape(-1, ts.size)
        a2.plot(ts, np.nanmean(sk, axis=0), color="C0", ls=ls, label=f"{act}: max |skewness|")
        a2.plot(ts, np.nanmean(ku, axis=0), color="C1", ls=ls, label=f"{act}: max |excess kurtosis|")
    _panel(a2, "t", f"over {cfg['n_directions']} projections (N = {int(nmax)})",
           "how non-Gaussian the cloud is (identity: sampling floor)")
    return _finish(fig, cfg, "ReLU feed-forward against the Gaussian closure", out_dir / "relu.png")


def _plot_phase(cfg, ds, out_dir):
    plt = plots.pyplot()
    from matplotlib.colors import LogNorm

    a, c = ds["a"].values, ds["c"].values
    sel = {k: 0 for k in ds["status"].dims if k not in ("a", "c")}
    st = ds["status"].isel(sel).values.astype(int)
    T = ds["blowup_time"].isel(sel).values
    tr = ds["trace_final"].isel(sel).values
    Tth = ds["theory_blowup_time"].isel(sel).values
    t1 = cfg["t1"]
    v = cfg["phase"]["v"]
    lam = float(np.linalg.eigvalsh(parameters(cfg)["S0"])[-1])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    # cells centred on the grid values; the axes span the grid (span_data below)
    ce, ae = plots.cell_edges(c), plots.cell_edges(a)
    im = axes[0].pcolormesh(ce, ae, np.where(st == status_code("blowup"), T, np.nan), cmap="magma_r",
                            vmin=0, vmax=t1, rasterized=True)
    fig.colorbar(im, ax=axes[0], label="numerical blow-up time T*")
    trp = np.where((st != status_code("blowup")) & np.isfinite(tr) & (tr > 0), tr, np.nan)
    im2 = axes[1].pcolormesh(ce, ae, trp, cmap="viridis", rasterized=True,
                             norm=LogNorm(vmin=max(np.nanmin(trp), 1e-8), vmax=np.nanmax(trp))
                             if np.any(np.isfinite(trp)) else None)
    fig.colorbar(im2, ax=axes[1], label=f"tr Σ(t1 = {t1:g}) (no blow-up)")
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where((st == status_code("blowup")) & np.isfinite(Tth), np.abs(T - Tth) / Tth, np.nan)
        im3 = axes[2].pcolormesh(ce, ae, np.log10(np.maximum(rel, 1e-17)), cmap="cividis",
                                 rasterized=True)
    fig.colorbar(im3, ax=axes[2], label=r"$\log_{10}\, |T^*_\mathrm{num} - T^*_\mathrm{theory}|\, /\, T^*_\mathrm{theory}$")
    cc = np.linspace(c[0], c[-1], 400)
    for ax in axes:
        # blow-up ever: v c > 0 and v c λmax > -a  → boundary a = -v c λmax for v c > 0, and c = 0
        pos = v * cc > 0
        ax.plot(cc[pos], -v * cc[pos] * lam, color="C0", ls="--", lw=1.2)
        ax.axvline(0.0, color="C0", ls="--", lw=1.0)
        if a.size > 1 and c.size > 1:
            ax.contour(c, a, np.where(np.isfinite(Tth), Tth, 1e9), levels=[t1], colors="r",
                       linewidths=1.5)
        ax.set_xlabel("c   (B = c I)")
        ax.set_ylabel("a   (A = a I)")
        plots.span_data(ax, c, "x")
        plots.span_data(ax, a, "y")
    axes[0].plot([], [], "r-", label=f"theory: T* = t1 = {t1:g}")
    axes[0].plot([], [], color="C0", ls="--", label="theory: blow-up ever (vcλmax + a = 0, c = 0)")
    axes[0].legend(fontsize=7, loc="lower left")
    axes[0].set_title("blow-up time (white: none before t1)", fontsize=9)
    axes[1].set_title("covariance size where there is no blow-up", fontsize=9)
    axes[2].set_title("numerical vs closed-form blow-up time", fontsize=9)
    fig.suptitle(f"{cfg['name']}: phase diagram of the moment ODE, V = {v:g} I, λmax(S0) = {lam:.3g}",
                 fontsize=10)
    return plots.save(fig, out_dir / "phase_diagram.png")
