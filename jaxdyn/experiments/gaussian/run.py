"""Kind ``gaussian``: the particle runs, the Gaussian closure and its closed forms, the phase diagram.

The particles go through the one chunk integrator (:mod:`..segments`); the closure and its
closed forms are :mod:`jaxdyn.gaussian`'s.
"""

from __future__ import annotations

import dataclasses
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
    """The particle field :class:`~jaxdyn.EuclideanAttention` of the parameters.

    Cast on the host and moved with ``device_put``: no program per array
    (:func:`segments.host_broadcast`).

    Args:
      p: the parameters (:func:`.schema.parameters`).
      activation: σ in A σ(x): ``identity`` or ``relu``.
      dtype: the floating type.
      kernel: the attention kernel.

    Returns:
      The model.
    """
    # cast on the host, moved with device_put: no program per array (segments.host_broadcast)
    return EuclideanAttention(*(jax.device_put(np.asarray(p[k], dtype)) for k in ("A", "B", "V")),
                              jax.device_put(np.asarray(p["b"], dtype)), activation=activation,
                              kernel=kernel)


def _frames_stats(model, xs, dirs, *, n_snapshot: int):
    return cloud_stats(xs, dirs) + (xs[:, :n_snapshot],)


@functools.lru_cache(maxsize=None)
def _stats_frames(n_snapshot: int):
    """The frame function of the particle runs, one function object per ``n_snapshot``.

    :func:`jaxdyn.gaussian.cloud_stats` and the first ``n_snapshot`` particles; one object per
    ``n_snapshot``, so that chunks share the compiled segment programs.

    Returns:
      ``frames(model, xs, dirs)``.
    """
    return functools.partial(_frames_stats, n_snapshot=n_snapshot)


@dataclasses.dataclass(frozen=True)
class Record:
    """What the particle runs record at each saved time besides the moments.

    Attributes:
      n_directions: projections for skewness and kurtosis (:func:`jaxdyn.gaussian.cloud_stats`).
      snapshot_index: saved-time indices whose particles are kept.
      snapshot_particles: particles kept per snapshot (the first ones).
    """

    n_directions: int = 16
    snapshot_index: tuple = ()
    snapshot_particles: int = 0


def _particle_inputs(model, x0s, record: Record):
    """The stacked models, the frame function and its directions of a batch of clouds."""
    P, n, d = x0s.shape
    models = jax.tree.map(lambda a: segments.host_broadcast(a, P) if eqx.is_array(a) else a, model)
    dirs = segments.host_broadcast(directions(d, record.n_directions, x0s.dtype), P)
    return models, _stats_frames(int(min(record.snapshot_particles, n))), (dirs,)


def run_particles(model, x0s, *, t1, dt, save_every, method="rk4", record: Record = Record()):
    """Integrate a batch of clouds under one particle model; per-frame statistics at saved times.

    The run goes through the experiments' one chunk integrator
    (:func:`..segments.integrate_segments`: sharded over devices, segments of at most
    ``MAX_STEPS_PER_CALL`` steps); the model is broadcast to every cloud. The trajectories are
    not kept.

    Args:
      model: the particle model (:func:`make_model`).
      x0s: (P, N, d) initial clouds.
      t1: final time.
      dt: the step.
      save_every: steps between saved times.
      method: the fixed-step method.
      record: what else to record (:class:`Record`).

    Returns:
      A dict of NumPy arrays with leading axes (P, S): ``mean``, ``cov``, ``radius``, ``skew``,
      ``kurt`` (see :func:`jaxdyn.gaussian.cloud_stats`), ``snapshots`` (P, len snapshot_index,
      snapshot_particles, d), plus ``ts`` (S,) and ``finite`` (P,).
    """
    models, frames, extra = _particle_inputs(model, x0s, record)
    cat, finite = segments.integrate_segments(
        models, x0s, frames, extra, schedule=segments.Schedule(t1, dt, save_every, method))
    snap = np.asarray(record.snapshot_index, int)
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


def _closure_fn(ts, rtol, atol, blowup_threshold):
    """The closure's solve (:func:`solve_moments`, saved at ``ts``) as a function of its parameters.

    Returns:
      ``solve(m0, S0, A, B, V, b)``.
    """
    def solve(m0, S0, A, B, V, b):
        return solve_moments(m0, S0, A=A, B=B, V=V, b=b, t1=float(ts[-1]),
                             saveat=jnp.asarray(ts, S0.dtype), rtol=rtol, atol=atol,
                             blowup_threshold=blowup_threshold)

    return solve


def _closure_args(p, dtype):
    return tuple(jnp.asarray(p[k], dtype) for k in ("m0", "S0", "A", "B", "V", "b"))


def closure(p, ts, *, dtype=np.float64, rtol=1e-10, atol=1e-12, blowup_threshold=1e6):
    """The identity model's Gaussian closure at times ``ts`` (memoised per process).

    Args:
      p: the parameters (:func:`.schema.parameters`).
      ts: the saved times.
      dtype: the solve's floating type.
      rtol: relative tolerance.
      atol: absolute tolerance.
      blowup_threshold: the solve stops at ‖Σ‖ ≥ threshold·max(‖S0‖, 1).

    Returns:
      ``(mean (S, d), cov (S, d, d), status, blowup_time)`` (NaN at and after a blow-up).
    """
    def solve():
        sol = _closure_fn(ts, rtol, atol, blowup_threshold)(*_closure_args(p, dtype))
        return (np.asarray(sol.mean, np.float64), np.asarray(sol.cov, np.float64),
                int(sol.status), float(sol.blowup_time))

    return _memo(_key(p, ts, np.dtype(dtype).name, rtol, atol, blowup_threshold, "closure"), solve)


def closed_form(p, ts):
    """Closed form of the closure's covariance when ``V = v I`` and S0 is invertible (memoised).

    :func:`jaxdyn.gaussian.vi_closed_form`, in float64.

    Args:
      p: the parameters.
      ts: the saved times.

    Returns:
      ``(cov (S, d, d) NaN from the blow-up on, T*)``, or ``(None, None)`` when there is no closed
      form.
    """
    v = scalar_v(p["V"])
    S0 = p["S0"]
    if v is None or np.linalg.eigvalsh(S0)[0] <= 1e-12 * max(1.0, np.abs(S0).max()):
        return None, None
    return _memo(_key(p, ts, "closed_form"), lambda: vi_closed_form(ts, S0, p["A"], p["B"], v))


def run_points(pcs):
    """Compute a chunk of ``gaussian`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    if pcs[0]["study"] == "phase_diagram":
        with jax.enable_x64(pcs[0]["dtype"] == "float64"):
            return _run_phase(pcs)
    # x64 on for the float64 closure (the reference); the particles run in cfg["dtype"]
    with jax.enable_x64(True):
        return _run_trajectory(pcs)


def grid_values(spec):
    """The values ``[min, max, num]`` of a phase-diagram axis (``np.linspace``)."""
    return np.linspace(float(spec[0]), float(spec[1]), int(spec[2]))


def _phase_inputs(pc):
    """The phase diagram's grid (a, c) and the batch ``(m0, S0, A, B, V, b)`` of its points."""
    dt = dtype_of(pc)
    p = parameters(pc)
    eye = np.eye(pc["d"])
    ph = pc["phase"]
    a, c = grid_values(ph["a"]), grid_values(ph["c"])
    aa, cc = np.meshgrid(a, c, indexing="ij")
    A = (aa.reshape(-1, 1, 1) * eye).astype(dt)
    B = (cc.reshape(-1, 1, 1) * eye).astype(dt)
    V = np.broadcast_to(ph["v"] * eye, A.shape).astype(dt)
    return (a, c), (p["m0"].astype(dt), p["S0"].astype(dt), A, B, V, p["b"].astype(dt))


def _phase_fn(pc):
    """:func:`solve_moments_batch` of the phase diagram as a function of ``(m0, S0, A, B, V, b)``."""
    rtol, atol = tolerances(pc)

    def solve(m0, S0, A, B, V, b):
        return solve_moments_batch(m0, S0, A=A, B=B, V=V, b=b, t1=pc["t1"], rtol=rtol, atol=atol,
                                   blowup_threshold=pc["blowup_threshold"])

    return solve


def _run_phase(pcs):
    rows = []
    for pc in pcs:
        (a, c), args = _phase_inputs(pc)
        sol = _phase_fn(pc)(*args)
        shp = (len(a), len(c))
        status = np.asarray(sol.status).reshape(shp)
        tr = np.trace(np.asarray(sol.cov_final, np.float64), axis1=-2, axis2=-1).reshape(shp)
        Tth, trth = phase_theory(parameters(pc)["S0"], a, c, pc["phase"]["v"], pc["t1"])
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


def _record(pc) -> Record:
    return Record(pc["n_directions"], tuple(int(i) for i in snapshot_index(pc)), pc["snapshot_particles"])


def _clouds(pcs, p, dtype):
    """(P, N, d) initial clouds from N(m0, S0), keys PRNGKey(seed), stacked on the host."""
    return jax.device_put(np.stack([  # stacked on the host (jnp.stack: one more program)
        np.asarray(gaussian_cloud(jax.random.PRNGKey(pc["seed"]), pcs[0]["n"], p["m0"], p["S0"], dtype=dtype))
        for pc in pcs]))


def step_functions(pc):
    """The device computations of a point.

    Args:
      pc: a point config.

    Returns:
      Study ``trajectory``: ``"segment"`` (one cloud's first segment and its frames,
      :func:`segments.segment_step`) and ``"closure"`` (:func:`solve_moments` in float64);
      ``phase_diagram``: ``"moments_batch"`` (:func:`solve_moments_batch` over the grid).
    """
    from ..kinds import StepFunction

    if pc["study"] == "phase_diagram":
        with jax.enable_x64(pc["dtype"] == "float64"):
            _, args = _phase_inputs(pc)
            return {"moments_batch": StepFunction(_phase_fn(pc), args, pc["dtype"] == "float64")}
    with jax.enable_x64(True):
        dt = dtype_of(pc)
        p = parameters(pc)
        x0s = _clouds([pc], p, dt)
        models, frames, extra = _particle_inputs(make_model(p, pc["activation"], dt, pc["kernel"]),
                                                 x0s, _record(pc))
        sdt, bounds = segments.Schedule(pc["t1"], pc["dt"], pc["save_every"], pc["method"]).bounds()
        steps = bounds[1] - bounds[0] if len(bounds) > 1 else 0
        one = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, (models, x0s, *extra))
        rtol, atol = tolerances(pc)
        return {
            "segment": StepFunction(segments.segment_step(frames, steps, sdt, pc["save_every"],
                                                          pc["method"]), one, True),
            "closure": StepFunction(_closure_fn(save_times(pc), rtol, atol, pc["blowup_threshold"]),
                                    _closure_args(p, np.float64), True),
        }


def _run_trajectory(pcs):
    p0 = pcs[0]
    dt = dtype_of(p0)
    p = parameters(p0)
    d = p0["d"]
    rtol, atol = tolerances(p0)
    ts = save_times(p0)
    snap = snapshot_index(p0)
    model = make_model(p, p0["activation"], dt, p0["kernel"])
    x0s = _clouds(pcs, p, dt)
    res = run_particles(model, x0s, t1=p0["t1"], dt=p0["dt"], save_every=p0["save_every"],
                        method=p0["method"], record=_record(p0))
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
