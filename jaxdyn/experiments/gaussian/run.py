"""Kind ``gaussian``: the particle runs (one chunk integrator, :mod:`..segments`), the
Gaussian closure and its closed forms (:mod:`jaxdyn.gaussian`), and the phase diagram."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ... import status_code
from ...gaussian import (bures_distance, cloud_stats, directions, gaussian_cloud,
                         phase_theory, scalar_v, solve_moments, solve_moments_batch, tilt_index,
                         vi_closed_form)
from ...models import EuclideanAttention
from .. import segments
from .schema import dtype_of, parameters, save_times, snapshot_index, tolerances


def make_model(p, activation="identity", dtype=jnp.float64, kernel="auto"):
    # cast on the host, moved with device_put: no program per array (segments.host_broadcast)
    return EuclideanAttention(*(jax.device_put(np.asarray(p[k], dtype)) for k in ("A", "B", "V")),
                              jax.device_put(np.asarray(p["b"], dtype)), activation=activation,
                              kernel=kernel)


def _frames_stats(model, xs, dirs, *, n_snapshot: int):
    return cloud_stats(xs, dirs) + (xs[:, :n_snapshot],)


@functools.lru_cache(maxsize=None)
def _stats_frames(n_snapshot: int):
    """The frame function of the particle runs: :func:`jaxdyn.gaussian.cloud_stats` and the
    first ``n_snapshot`` particles; one function object per ``n_snapshot``, so that chunks
    share the compiled segment programs (a partial of a module-level function: the segment
    program's cache key can name it, so a later process loads it without tracing)."""
    return functools.partial(_frames_stats, n_snapshot=n_snapshot)


def run_particles(model, x0s, *, t1, dt, save_every, method="rk4", n_directions=16,
                  snapshot_index=(), snapshot_particles=0):
    """Integrate a batch of clouds ``x0s`` (P, N, d) under one particle model and return
    per-frame statistics at the saved times (``save_every`` steps of ``dt``) without keeping
    the trajectories: a dict of NumPy arrays with leading axes (P, S) — ``mean``, ``cov``,
    ``radius``, ``skew``, ``kurt`` (see :func:`jaxdyn.gaussian.cloud_stats`), ``snapshots``
    (P, len snapshot_index, snapshot_particles, d) — plus ``ts`` (S,) and ``finite`` (P,).

    The run goes through the experiments' one chunk integrator
    (:func:`..segments.integrate_segments`: sharded over devices, segments of at most
    ``MAX_STEPS_PER_CALL`` steps); the model is broadcast to every cloud.
    """
    P, n, d = x0s.shape
    models = jax.tree.map(lambda a: segments.host_broadcast(a, P) if eqx.is_array(a) else a, model)
    dirs = segments.host_broadcast(directions(d, n_directions, x0s.dtype), P)
    frames = _stats_frames(int(min(snapshot_particles, n)))
    cat, finite = segments.integrate_segments(models, x0s, frames, (dirs,), t1=t1, dt=dt,
                                              save_every=save_every, method=method)
    snap = np.asarray(snapshot_index, int)
    return dict(mean=cat[0], cov=cat[1], radius=cat[2], skew=cat[3], kurt=cat[4],
                snapshots=cat[5][:, snap] if snap.size else cat[5][:, :0],
                ts=segments.save_times(t1, dt, save_every), finite=finite)


_MEMO: dict = {}


def _memo(key, fn):
    """Per-process memo of closure solves: the chunks of one run share them."""
    if key not in _MEMO:
        if len(_MEMO) > 32:
            _MEMO.clear()
        _MEMO[key] = fn()
    return _MEMO[key]


def _key(p, ts, *extra):
    return (tuple((k, np.asarray(p[k], np.float64).tobytes()) for k in sorted(p)),
            np.asarray(ts, np.float64).tobytes()) + extra


def closure(p, ts, *, dtype=np.float64, rtol=1e-10, atol=1e-12, blowup_threshold=1e6):
    """The identity model's Gaussian closure at times ``ts``: ``(mean (S, d), cov (S, d, d),
    status, blowup_time)`` (NaN at and after a blow-up), via :func:`solve_moments`."""
    def solve():
        c = lambda k: jnp.asarray(p[k], dtype)  # noqa: E731
        sol = solve_moments(c("m0"), c("S0"), A=c("A"), B=c("B"), V=c("V"), b=c("b"),
                            t1=float(ts[-1]), saveat=jnp.asarray(ts, dtype), rtol=rtol, atol=atol,
                            blowup_threshold=blowup_threshold)
        return (np.asarray(sol.mean, np.float64), np.asarray(sol.cov, np.float64),
                int(sol.status), float(sol.blowup_time))

    return _memo(_key(p, ts, np.dtype(dtype).name, rtol, atol, blowup_threshold, "closure"), solve)


def closed_form(p, ts):
    """Closed form of the closure's covariance when ``V = v I`` and S0 is invertible
    (:func:`jaxdyn.gaussian.vi_closed_form`, memoised): ``(cov (S, d, d) NaN from the blow-up
    on, T*)``, or ``(None, None)`` when there is no closed form. float64."""
    v = scalar_v(p["V"])
    S0 = p["S0"]
    if v is None or np.linalg.eigvalsh(S0)[0] <= 1e-12 * max(1.0, np.abs(S0).max()):
        return None, None
    return _memo(_key(p, ts, "closed_form"), lambda: vi_closed_form(ts, S0, p["A"], p["B"], v))


def run_points(pcs):
    if pcs[0]["study"] == "phase_diagram":
        with jax.enable_x64(pcs[0]["dtype"] == "float64"):
            return _run_phase(pcs)
    # x64 on for the float64 closure (the reference); the particles run in cfg["dtype"]
    with jax.enable_x64(True):
        return _run_trajectory(pcs)


def grid_values(spec):
    return np.linspace(float(spec[0]), float(spec[1]), int(spec[2]))


def _run_phase(pcs):
    rows = []
    for pc in pcs:
        dt = dtype_of(pc)
        p = parameters(pc)
        d = pc["d"]
        ph = pc["phase"]
        a, c = grid_values(ph["a"]), grid_values(ph["c"])
        aa, cc = np.meshgrid(a, c, indexing="ij")
        eye = np.eye(d)
        A = (aa.reshape(-1, 1, 1) * eye).astype(dt)
        B = (cc.reshape(-1, 1, 1) * eye).astype(dt)
        V = np.broadcast_to(ph["v"] * eye, A.shape).astype(dt)
        rtol, atol = tolerances(pc)
        sol = solve_moments_batch(p["m0"].astype(dt), p["S0"].astype(dt), A=A, B=B, V=V,
                                  b=p["b"].astype(dt), t1=pc["t1"], rtol=rtol, atol=atol,
                                  blowup_threshold=pc["blowup_threshold"])
        shp = aa.shape
        status = np.asarray(sol.status).reshape(shp)
        tr = np.trace(np.asarray(sol.cov, np.float64), axis1=-2, axis2=-1).reshape(shp)
        Tth, trth = phase_theory(p["S0"], a, c, ph["v"], pc["t1"])
        rows.append({
            "blowup_time": np.asarray(sol.blowup_time, np.float64).reshape(shp),
            "trace_final": tr, "t_final": np.asarray(sol.t_final, np.float64).reshape(shp),
            "status": status, "num_steps": np.asarray(sol.num_steps).reshape(shp),
            "theory_blowup_time": Tth, "theory_trace": trth,
            "stiff": np.asarray(sol.stiff).reshape(shp),
            "finite": bool(np.all(status != status_code("nonfinite"))),
        })
    dims = {k: ("a", "c") for k in rows[0] if k != "finite"}
    dims["finite"] = ()
    vars_ = {k: (dims[k], np.stack([np.asarray(r[k]) for r in rows])) for k in rows[0]}
    return vars_, {"a": a, "c": c}


def _run_trajectory(pcs):
    p0 = pcs[0]
    dt = dtype_of(p0)
    p = parameters(p0)
    d = p0["d"]
    rtol, atol = tolerances(p0)
    ts = save_times(p0)
    snap = snapshot_index(p0)
    model = make_model(p, p0["activation"], dt, p0["kernel"])
    x0s = jax.device_put(np.stack([  # stacked on the host (jnp.stack: one more program)
        np.asarray(gaussian_cloud(jax.random.PRNGKey(pc["seed"]), p0["n"], p["m0"], p["S0"], dtype=dt))
        for pc in pcs]))
    res = run_particles(model, x0s, t1=p0["t1"], dt=p0["dt"], save_every=p0["save_every"],
                        method=p0["method"], n_directions=p0["n_directions"], snapshot_index=snap,
                        snapshot_particles=p0["snapshot_particles"])
    mc, Cc, status, tstar = closure(p, ts, dtype=np.float64, rtol=rtol, atol=atol,
                                    blowup_threshold=p0["blowup_threshold"])
    Ccf, Tcf = closed_form(p, ts)
    P = len(pcs)
    rep = lambda a: np.broadcast_to(a, (P,) + np.shape(a)).copy()  # noqa: E731
    mean_p = np.asarray(res["mean"], np.float64)
    cov_p = np.asarray(res["cov"], np.float64)
    vars_ = {
        "mean_particles": (("t", "component"), mean_p),
        "cov_particles": (("t", "component", "component_b"), cov_p),
        "trace_particles": (("t",), np.trace(cov_p, axis1=-2, axis2=-1)),
        "radius": (("t",), np.asarray(res["radius"], np.float64)),
        "skew": (("t",), np.asarray(res["skew"], np.float64)),
        "kurt": (("t",), np.asarray(res["kurt"], np.float64)),
        "mean_closure": (("t", "component"), rep(mc)),
        "cov_closure": (("t", "component", "component_b"), rep(Cc)),
        "trace_closure": (("t",), rep(np.trace(Cc, axis1=-2, axis2=-1))),
        "trace_closed_form": (("t",), rep(np.trace(Ccf, axis1=-2, axis2=-1) if Ccf is not None
                                          else np.full(ts.shape, np.nan))),
        "bures": (("t",), bures_distance(mean_p, cov_p, mc[None], Cc[None])),
        "tilt_closure": (("t",), rep(tilt_index(Cc, p["B"]))),
        "x_snapshot": (("t_snapshot", "particle", "component"),
                       np.asarray(res["snapshots"], np.float64)),
        "closure_status": ((), np.full(P, status, np.int32)),
        "closure_blowup_time": ((), np.full(P, tstar)),
        "theory_blowup_time": ((), np.full(P, np.nan if Tcf is None else Tcf)),
        "finite": ((), np.asarray(res["finite"], bool)),
    }
    return vars_, {"t": ts, "t_snapshot": ts[snap]}
