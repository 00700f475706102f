"""Figure layout: axes that span the data, S¹ on a flat circle, legends off the data, tick labels apart.

Colours are explained by colour bars. The figures are drawn from small synthetic data and
checked on the Agg renderer (window extents in pixels) before they are written: ``plots.save``
is replaced by a recorder, which lays each figure out as a draw would
(``Figure.draw_without_rendering``: positions and extents, no rasterizing).
"""

import itertools

import numpy as np
import pytest
import xarray as xr

from jaxdyn import plots

plt = plots.pyplot()


@pytest.fixture
def drawn(monkeypatch):
    """The figures the code under test would save, laid out on the Agg canvas and kept open."""
    figs = []

    def record(fig, path):
        fig.draw_without_rendering()
        figs.append(fig)
        return path

    monkeypatch.setattr(plots, "save", record)
    yield figs
    for fig in figs:
        plt.close(fig)


@pytest.fixture(scope="module")
def drawn_once(tmp_path_factory):
    """``draw(key, plot)``: ``(paths, figures)`` that ``plot(out_dir)`` would save, drawn once
    per key for the module (tests that read the same figures share them), closed at its end."""
    cache = {}

    def draw(key, plot):
        if key not in cache:
            figs = []

            def record(fig, path):
                fig.draw_without_rendering()
                figs.append(fig)
                return path

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(plots, "save", record)
                paths = plot(tmp_path_factory.mktemp("figures"))
            cache[key] = (paths, figs)
        return cache[key]

    yield draw
    for _, figs in cache.values():
        for fig in figs:
            plt.close(fig)


def _number(text):
    return float(text.replace("−", "-"))


def _shown_ticks(ax, which):
    """(position, label Text) of the ticks of one axis that are drawn (inside the view limits)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(axis.get_view_interval())
    pad = 1e-9 * max(1.0, abs(hi - lo))
    locs = axis.get_majorticklocs()
    out = []
    for pos, tick in zip(locs, axis.get_major_ticks(len(locs))):
        for lab in (tick.label1, tick.label2):
            if lo - pad <= pos <= hi + pad and lab.get_visible() and lab.get_text():
                out.append((pos, lab))
    return out


def _overlap(a, b, tol=-3.0):
    """Two display boxes overlap by more than ``tol`` pixels both ways (tol < 0: come closer than −tol)."""
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tol) and (min(a.y1, b.y1) - max(a.y0, b.y0) > tol)


def _tick_label_clashes(fig):
    """Pairs of drawn tick labels whose boxes overlap, and tick labels lying over another axes' plot area."""
    r = fig.canvas.get_renderer()
    labels = []
    for ax in fig.axes:
        for which in ("x", "y"):
            labels += [(ax, lab.get_text(), lab.get_window_extent(r)) for _, lab in _shown_ticks(ax, which)]
    clashes = [(t1, t2) for (_, t1, b1), (_, t2, b2) in itertools.combinations(labels, 2) if _overlap(b1, b2)]
    for (ax, text, box), other in itertools.product(labels, fig.axes):
        over = other.get_visible() and other.axison and _overlap(box, other.get_window_extent(r))
        if other is not ax and over:
            clashes.append((text, f"axes {other.get_title() or other.get_ylabel()!r}"))
    return clashes


def _dense_display_points(ax, line, per_segment=25):
    xy = np.column_stack([np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)])
    xy = xy[np.all(np.isfinite(xy), axis=1)]
    if len(xy) == 0:
        return xy
    d = ax.transData.transform(xy)
    if len(d) == 1:
        return d
    s = np.linspace(0, 1, per_segment, endpoint=False)[:, None, None]
    seg = d[:-1][None] + s * (d[1:] - d[:-1])[None]
    return np.concatenate([seg.reshape(-1, 2), d[-1:]])


def _legend_over_data(fig):
    """Number of plotted line points (densely sampled, display coordinates) under a legend."""
    r = fig.canvas.get_renderer()
    hits = 0
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        box = leg.get_window_extent(r)
        for line in ax.get_lines():
            p = _dense_display_points(ax, line)
            if len(p):
                inside = (p[:, 0] > box.x0) & (p[:, 0] < box.x1) & (p[:, 1] > box.y0) & (p[:, 1] < box.y1)
                hits += int(inside.sum())
    return hits


# ---- β-axis heat maps -------------------------------------------------------------------

def _check_value_axis(ax, values):
    """The β axis names only β values in the data, names the first and the last, spans the rows."""
    values = np.asarray(values, float)
    ticks = _shown_ticks(ax, "y")
    assert ticks, "no labelled β ticks"
    shown = np.array([_number(lab.get_text()) for _, lab in ticks])
    lo, hi = values.min(), values.max()
    assert np.all(shown >= lo - 1e-2 * abs(lo) - 1e-12) and np.all(shown <= hi + 1e-2 * abs(hi) + 1e-12), \
        (shown, values)
    for v in (lo, hi):
        assert np.any(np.isclose(shown, v, rtol=1e-2)), (v, shown)
    if len(values) <= 9:
        assert all(np.any(np.isclose(shown, v, rtol=1e-2)) for v in values), (shown, values)
    if len(values) > 1:
        pos = {round(float(_number(lab.get_text())), 12): p for p, lab in ticks}
        p_lo = [p for p, lab in ticks if np.isclose(_number(lab.get_text()), lo, rtol=1e-2)][0]
        p_hi = [p for p, lab in ticks if np.isclose(_number(lab.get_text()), hi, rtol=1e-2)][0]
        step = abs(p_hi - p_lo) / (len(values) - 1)
        y0, y1 = sorted(ax.get_ylim())
        assert min(p_lo, p_hi) - step <= y0 and y1 <= max(p_lo, p_hi) + step, (ax.get_ylim(), pos)


@pytest.mark.parametrize("betas", [[0.1, 9.0], [1.0, 9.0], list(np.linspace(0.1, 9.0, 16)),
                                   list(np.geomspace(1.0, 1000.0, 13))],
                         ids=["two", "two-integer", "linspace16", "geomspace13"])
def test_heat_map_beta_axis_spans_the_betas(drawn, betas):
    t = np.linspace(0.0, 30.0, 31)
    z = np.random.default_rng(0).uniform(0.1, 1.0, (len(betas), t.size))
    plots.heatmaps(t, betas, {"a": z, "b": z + 1.0}, "unused.png", log_panels=(1,),
                   xlabel="t (depth)", ylabel="β", title="phase diagram")
    (fig,) = drawn
    panels = [ax for ax in fig.axes if ax.get_ylabel() == "β"]
    assert len(panels) == 2
    for ax in panels:
        _check_value_axis(ax, betas)
        assert ax.get_xlim() == pytest.approx((0.0, 30.0))
    assert not _tick_label_clashes(fig)


def _sphere_dataset(betas, d, n_snap=10, n=16, seeds=2):
    rng = np.random.default_rng(1)
    t = np.linspace(0.0, 20.0, 11)
    ts = np.linspace(0.0, 20.0, n_snap)
    x = rng.normal(size=(len(betas), seeds, n_snap, n, d))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    u = rng.uniform(size=(len(betas), seeds, t.size))
    return xr.Dataset(
        {"mean_inner_product": (("beta", "seed", "t"), u),
         "x_snapshot": (("beta", "seed", "t_snapshot", "particle", "component"), x),
         "pair_fraction": (("beta", "seed", "t"), u),
         "cluster_count": (("beta", "seed", "t"), 1.0 + 10 * u)},
        coords={"beta": np.asarray(betas, float), "seed": np.arange(seeds), "t": t, "t_snapshot": ts})


SPHERE_CFG = {"name": "s", "beta": 1.0, "figure_beta": None, "pair_threshold": 0.999, "cluster_delta": 1e-4}


def _sphere_two_beta_s1(drawn_once):
    """The sphere kind's figures of a two-β S¹ run (drawn once for the module)."""
    from jaxdyn.experiments.sphere import figures

    return drawn_once("sphere-s1", lambda out: figures.plot(
        SPHERE_CFG, _sphere_dataset([1.0, 9.0], d=2), out))


def test_sphere_kind_two_beta_phase_diagram(drawn_once):
    paths, drawn = _sphere_two_beta_s1(drawn_once)
    fig = drawn[[p.name for p in paths].index("phase_diagram.png")]
    panels = [ax for ax in fig.axes if ax.get_ylabel() == "β"]
    assert len(panels) == 2
    for ax in panels:
        _check_value_axis(ax, [1.0, 9.0])
        assert ax.get_xlim() == pytest.approx((0.0, 20.0))


# ---- particles ----------------------------------------------------------------------------

def _panels(fig):
    return [ax for ax in fig.axes if ax.get_title().startswith("t = ")]


def _rows(axes):
    return len({round(ax.get_position().y0, 3) for ax in axes})


def _colour_bar_labels(fig):
    return [ax.get_ylabel() for ax in fig.axes if not ax.get_title().startswith("t = ")]


def test_s1_particles_are_drawn_on_a_flat_circle_in_a_grid(drawn_once):
    paths, drawn = _sphere_two_beta_s1(drawn_once)
    fig = drawn[[p.name for p in paths].index("particles.png")]
    panels = _panels(fig)
    assert len(panels) == 10
    for ax in panels:
        assert ax.name == "rectilinear"  # 2-D, not a 3-D globe
        assert ax.get_aspect() == 1.0
        assert ax.get_xlim() == pytest.approx(ax.get_ylim())
    assert _rows(panels) >= 2
    assert max(sum(round(a.get_position().y0, 3) == round(ax.get_position().y0, 3) for a in panels)
               for ax in panels) <= 5
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    assert box.width / box.height < 3.0, (box.width, box.height)
    assert any("θ" in lab for lab in _colour_bar_labels(fig)), _colour_bar_labels(fig)


def test_s2_particles_explain_their_colour(drawn, tmp_path):
    plots.sphere_snapshots(_sphere_dataset([1.0], d=3, n_snap=4)["x_snapshot"].values[0, 0],
                           np.arange(4.0), tmp_path / "p.png", title="s2")
    (fig,) = drawn
    panels = _panels(fig)
    assert len(panels) == 4 and all(ax.name == "3d" for ax in panels)
    labels = _colour_bar_labels(fig)
    assert any("x₃" in lab and "t = 0" in lab for lab in labels), labels


def test_particle_movie_has_a_colour_bar(monkeypatch, tmp_path):
    from matplotlib.figure import Figure

    x = np.random.default_rng(2).normal(size=(2, 8, 2))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    shown = []
    colorbar = Figure.colorbar

    def spy(self, *a, **kw):
        cb = colorbar(self, *a, **kw)
        shown.append(cb.ax.get_ylabel())
        return cb

    monkeypatch.setattr(Figure, "colorbar", spy)
    plots.particle_movie(x, np.arange(2.0), tmp_path / "m.gif")
    assert len(shown) == 1 and "θ" in shown[0], shown


# ---- legends ------------------------------------------------------------------------------

def test_mass_fraction_legend_covers_no_data(drawn):
    t = np.linspace(0.0, 20.0, 81)
    betas = [10, 30, 100, 300, 1000, 3000]
    mE = [np.clip(np.sin(t / (2 + i)) ** 2 * (0.2 + 0.15 * i), 0, 1) for i in range(6)]
    mV = [1 / (1 + np.exp(-(t - 3 - 2.5 * i))) for i in range(6)]
    plots.mass_fractions(t, betas, mE, mV, "unused.png", angle=3.0, title="m")
    (fig,) = drawn
    assert _legend_over_data(fig) == 0


def test_curves_legend_covers_no_data(drawn):
    t = np.linspace(0.0, 10.0, 60)
    rng = np.random.default_rng(3)
    ys = {f"β = {b}": rng.uniform(0, 1, (3, t.size)) for b in (1, 4, 9)}
    ys["one run"] = np.linspace(0, 1, t.size)
    plots.curves(t, ys, "unused.png", xlabel="t", ylabel="y", title="c")
    (fig,) = drawn
    assert _legend_over_data(fig) == 0
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert labels == list(ys)  # one entry per label, however many runs it has


# ---- the PDE space–time image ------------------------------------------------------------

def _pde_dataset(betas, m=128, nt=61):
    rng = np.random.default_rng(4)
    theta = np.linspace(0, 2 * np.pi, m, endpoint=False)
    t = np.linspace(0.0, 600.0, nt)
    rho = rng.uniform(0.0, 5.0, (len(betas), nt, m)) / (2 * np.pi)
    k = np.arange(1, 9)
    g = rng.normal(size=(len(betas), k.size))
    ones = np.ones(len(betas))
    return xr.Dataset(
        {"rho": (("beta", "t", "theta"), rho), "growth_theory": (("beta", "k"), g),
         "growth_measured": (("beta", "k"), g), "k_star": (("beta",), 3 * ones),
         "first_cluster_count": (("beta",), 3 * ones),
         "cluster_count": (("beta", "t"), np.minimum(np.arange(nt) // 10, 3) * ones[:, None])},
        coords={"beta": np.asarray(betas, float), "t": t, "theta": theta, "k": k})


def _pde_figures(drawn_once, betas):
    """The pde kind's figures (mode clusters) of ``_pde_dataset(betas)``, drawn once a module."""
    from jaxdyn.experiments.pde import figures

    cfg = {"mode": "clusters", "beta": 1.0, "figure_betas": [], "name": "p"}
    return drawn_once(("pde", tuple(betas)), lambda out: figures.plot(cfg, _pde_dataset(betas), out))


@pytest.mark.parametrize("betas", [[2.0, 3.0, 5.0], [2.0, 5.0, 20.0, 100.0], [1.0, 2, 4, 8, 16, 32]])
def test_pde_space_time_tick_labels_do_not_overlap(drawn_once, betas):
    paths, drawn = _pde_figures(drawn_once, betas)
    names = [p.name for p in paths]
    assert "spacetime.png" in names
    for name, fig in zip(names, drawn):
        assert not _tick_label_clashes(fig), (name, _tick_label_clashes(fig))


def test_pde_cluster_figure_marks_the_betas(drawn_once):
    paths, drawn = _pde_figures(drawn_once, [2.0, 3.0, 5.0])
    fig = drawn[[p.name for p in paths].index("cluster_counts.png")]
    ax = [a for a in fig.axes if a.get_xlabel() == "β"][0]
    shown = sorted(_number(lab.get_text()) for _, lab in _shown_ticks(ax, "x"))
    assert shown == [2.0, 3.0, 5.0]


# ---- the Gaussian phase diagram -----------------------------------------------------------

@pytest.mark.parametrize("grid", [(2, 2), (5, 3)])
def test_gaussian_phase_diagram_spans_the_grid(drawn, tmp_path, grid):
    from jaxdyn import status_code
    from jaxdyn.experiments.gaussian import figures
    from jaxdyn.experiments.planning import resolve_config

    na, nc = grid
    cfg = resolve_config({"kind": "gaussian", "name": "g", "study": "phase_diagram", "d": 2,
                          "dtype": "float64", "S0": [[1.0, 0.0], [0.0, 0.5]], "t1": 2.0,
                          "phase": {"a": [-1.0, 1.0, na], "c": [0.5, 2.0, nc], "v": 1.0}})
    a, c = np.linspace(-1.0, 1.0, na), np.linspace(0.5, 2.0, nc)
    A, C = np.meshgrid(a, c, indexing="ij")
    with np.errstate(invalid="ignore", divide="ignore"):
        Tth = np.log1p(A / C) / (2 * A)
    blow = np.isfinite(Tth) & (Tth < 2.0)
    ds = xr.Dataset({"status": (("a", "c"), np.where(blow, status_code("blowup"), 0)),
                     "blowup_time": (("a", "c"), np.where(blow, Tth, np.inf)),
                     "trace_final": (("a", "c"), np.where(blow, np.nan, 1.0 + A ** 2)),
                     "theory_blowup_time": (("a", "c"), Tth)}, coords={"a": a, "c": c})
    figures.plot(cfg, ds, tmp_path)
    (fig,) = drawn
    panels = [ax for ax in fig.axes if ax.get_xlabel().startswith("c")]
    assert len(panels) == 3
    for ax in panels:
        assert ax.get_xlim() == pytest.approx((0.5, 2.0))
        assert ax.get_ylim() == pytest.approx((-1.0, 1.0))
