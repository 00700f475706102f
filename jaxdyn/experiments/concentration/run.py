"""Kind ``concentration``: integrate a chunk of points; W2 to Π#ρ0, Lyapunov functional, masses.

The library's Π (:func:`jaxdyn.projection`), L (:func:`jaxdyn.lyapunov`) and
:func:`jaxdyn.mass_near` at every saved frame, the mass near E and near E(V).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ...distances import w2_coupling, w2_exact, w2_sinkhorn
from ...spectral import lyapunov, mass_near, subspace_angle
from .. import progress
from .. import sphere_common as sc
from .schema import magnitude_basis, spectral_info


def _frames(model, xs, target, P_E, bE, bV, near):
    """Per saved frame: the cloud, coupling W2 to Π(x0), Lyapunov mean/median, mass near E and E(V).

    Module-level so that chunks share its compiled program.

    Returns:
      A tuple of per-frame arrays.
    """
    L = lyapunov(xs, P_E)
    return (xs, w2_coupling(xs, target[None]).value, jnp.mean(L, -1), jnp.median(L, -1),
            mass_near(xs, bE, near), mass_near(xs, bV, near))


def _project_fn(pi, x):
    """Π(x) in one program (called eagerly, its matmul, norm and division are three)."""
    return pi(x)


# one program each (called eagerly: one for each of their operations)
_project = jax.jit(_project_fn)
_mass_near = jax.jit(mass_near)


def two_atoms(y, tol=None):
    """The two atoms of a cloud that lies within ``tol`` of two points, else None.

    Π#ρ0 is two atoms when dim E = 1: Π(x) = ±u up to rounding.

    Args:
      y: (N, d) the cloud.
      tol: the distance to the atoms (default 64 ulps of ``y``'s dtype).

    Returns:
      ``(a, b, near_a)``: the atoms (the groups' float64 means) and each point's label (True: a);
      or None.
    """
    y = np.asarray(y)
    tol = 64 * np.finfo(y.dtype if y.dtype.kind == "f" else np.float64).eps if tol is None else tol
    y = y.astype(np.float64)
    a = y[0]
    b = y[np.argmax(((y - a) ** 2).sum(-1))]
    near_a = ((y - a) ** 2).sum(-1) <= ((y - b) ** 2).sum(-1)
    a = y[near_a].mean(0)
    b = y[~near_a].mean(0) if (~near_a).any() else a
    dist = np.sqrt(np.where(near_a, ((y - a) ** 2).sum(-1), ((y - b) ** 2).sum(-1)))
    return (a, b, near_a) if dist.max() <= tol else None


def w2_to_two_atoms(xs, a, b, m_a):
    """Exact W2 between each cloud of ``xs`` and a uniform cloud on two atoms, by a partial sort.

    The target has ``m_a`` points at ``a`` and N − ``m_a`` at ``b``: the optimal assignment sends
    to ``a`` the m_a points with the smallest |x − a|² − |x − b|² (an exchange argument), so it
    costs a partial sort instead of an N × N assignment; float64 on the host, like
    :func:`jaxdyn.w2_exact` (equal to it up to rounding).

    Args:
      xs: (S, N, d) clouds.
      a: (d,) the first atom.
      b: (d,) the second atom.
      m_a: the target's points at ``a``.

    Returns:
      (S,) distances.
    """
    xs = np.asarray(xs, np.float64)
    ca = ((xs - a) ** 2).sum(-1)
    cb = ((xs - b) ** 2).sum(-1)
    diff = ca - cb
    n = xs.shape[-2]
    if 0 < m_a < n:
        extra = np.partition(diff, m_a - 1, axis=-1)[..., :m_a].sum(-1)
    else:
        extra = diff.sum(-1) if m_a == n else np.zeros(diff.shape[:-1])
    return np.sqrt(np.maximum(cb.sum(-1) + extra, 0.0) / n)


def _w2_exact_frames(xs, target, on_frame=lambda j: None):
    """Exact W2 of the frames ``xs`` (S, N, d) to ``target`` (N, d).

    The two-atom partial sort when Π#ρ0 is two atoms (within 64 ulps: the value differs from the
    assignment on the unrounded target by at most that), else one optimal assignment per frame.

    Returns:
      (S,) distances.
    """
    atoms = two_atoms(target)
    if atoms is not None and np.all(np.isfinite(xs)):
        a, b, near_a = atoms
        return w2_to_two_atoms(xs, a, b, int(near_a.sum()))
    out = []
    for j in range(len(xs)):
        out.append(w2_exact(xs[j], target))
        on_frame(j + 1)
    return np.asarray(out)


def _frame_inputs(pcs):
    """The frame function's extra arrays and constants of a chunk.

    Returns:
      ``(Π in the particles' dtype, a float64 basis of E(V), (targets Π(x_i(0)),),
      (P_E, basis of E, basis of E(V), the 'near' angle))``.
    """
    p0 = pcs[0]
    dtype = sc.np_dtype(p0)
    pi, basis_V = spectral_info(p0)
    # Π in the particles' dtype, cast on the host (an eager device cast is a program to load)
    pi = jax.tree.map(lambda a: jax.device_put(np.asarray(np.asarray(a), dtype)), pi)
    bV = np.asarray(basis_V, dtype)
    near = np.asarray(math.radians(p0["near_angle_deg"]), dtype)
    targets = _project(pi, sc.initial_clouds(pcs))  # Π(x_i(0))
    return pi, basis_V, (targets,), (pi.projector, pi.basis, bV, near)


def step_functions(pc):
    """The device computations of a point: its segment and frames, and a Sinkhorn W2.

    The segment carries the W2/Lyapunov/mass frames; the debiased Sinkhorn W2 of a frame is
    added when ``w2_methods`` has ``sinkhorn``.

    Args:
      pc: a point config.

    Returns:
      ``{"segment": ...}`` (:func:`sphere_common.segment_steps`), with ``"w2_sinkhorn"``.
    """
    from ..kinds import StepFunction

    _, _, extra, consts = _frame_inputs([pc])
    steps = sc.segment_steps(pc, _frames, extra, consts)
    if "sinkhorn" in pc["w2_methods"]:
        x0 = np.asarray(sc.initial_clouds([pc])[0])
        steps["w2_sinkhorn"] = StepFunction(w2_sinkhorn, (x0, np.asarray(extra[0][0])),
                                            pc["dtype"] == "float64")
    return steps


def run_points(pcs):
    """Compute a chunk of ``concentration`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    p0 = pcs[0]
    dtype = sc.np_dtype(p0)
    pi, basis_V, extra, consts = _frame_inputs(pcs)
    (targets,) = extra
    near = consts[3]
    if {"exact", "sinkhorn"} & set(p0["w2_methods"]):
        progress.plan(integrate=2, w2=1)
    progress.stage("integrate")

    (xs_np, coup, Lmean, Lmed, mE, mV), finite = sc.integrate_chunk(pcs, _frames, extra, consts=consts)
    tg_np = np.asarray(targets)
    ts = sc.save_times(p0)
    k = np.arange(0, len(ts), p0["w2_every"])
    if k[-1] != len(ts) - 1:
        k = np.append(k, len(ts) - 1)
    vars_ = {
        "lyapunov_mean": (("t",), Lmean),
        "lyapunov_median": (("t",), Lmed),
        "mass_E": (("t",), mE),
        "mass_V": (("t",), mV),
        "finite": ((), finite),
    }
    bM = magnitude_basis(p0)  # Conjecture 1's second reading, recorded where it differs
    if bM.shape != basis_V.shape or subspace_angle(bM, basis_V) > 1e-6:  # arccos: ~1e-8 for equal spaces
        vars_["mass_V_magnitude"] = (("t",), np.asarray(_mass_near(xs_np, np.asarray(bM, dtype), near)))
    if "coupling" in p0["w2_methods"]:
        vars_["w2_coupling"] = (("t",), coup)
    P = len(pcs)
    progress.stage("w2")
    if "exact" in p0["w2_methods"]:
        vals = np.full((P, len(k)), np.nan)
        for i in range(P):
            if bool(finite[i]):
                vals[i] = _w2_exact_frames(xs_np[i, k], tg_np[i],
                                           lambda j, i=i: progress.advance(i * len(k) + j, P * len(k)))
            progress.advance(i + 1, P)
        vars_["w2_exact"] = (("t_w2",), vals)
    if "sinkhorn" in p0["w2_methods"]:
        vals = np.full((P, len(k)), np.nan)
        eps = np.full((P, len(k)), np.nan)
        conv = np.zeros((P, len(k)), bool)
        for i in range(P):
            if not bool(finite[i]):
                continue
            for jj, j in enumerate(k):
                r = w2_sinkhorn(xs_np[i, j], tg_np[i])
                vals[i, jj], eps[i, jj], conv[i, jj] = r.value, r.epsilon, r.converged
                progress.advance(i * len(k) + jj + 1, P * len(k))
        vars_["w2_sinkhorn"] = (("t_w2",), vals)
        vars_["sinkhorn_epsilon"] = (("t_w2",), eps)
        vars_["sinkhorn_converged"] = (("t_w2",), conv)
    coords = {"t": ts, "t_w2": ts[k]}
    return vars_, coords
