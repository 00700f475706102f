"""Transfer of controls to N particles and to an L-layer transformer; W2 of a cloud.

The distance of a particle cloud to a Gaussian target is :func:`cloud_w2_to_gaussian`.
"""

from __future__ import annotations

from typing import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._checks import check_dtype, check_finite, nan_where, scalar_domain
from .._results import RESULTS, Solution, from_codes, status_code
from ..distances import w2_exact
from ..distances._bures import clipped_bures_w2_squared
from ..gaussian._particles import gaussian_cloud
from ..integrators import INTEGRATORS
from ..models._control import Control
from ..models._fields import EuclideanAttention
from ..simulation._simulate import fixed_steps, saved_states


# ---------------------------------------------------------------------------------------
# Transfer to particles and to a discrete transformer
# ---------------------------------------------------------------------------------------


#: the controlled particle field of Paper B is :class:`jaxdyn.models.EuclideanAttention` with
#: :class:`Control` parameters (the name users of ``jaxdyn.control`` know)
ControlledEuclideanAttention = EuclideanAttention


def _piece_info(model):
    """(piecewise?, n_pieces, t1) of a model's Controls (all must share the grid)."""
    ctrls = [p for p in (model.A, model.B, model.V, model.b) if isinstance(p, Control)]
    if not ctrls:
        return False, 1, None
    kinds = {c.kind for c in ctrls}
    ns = {(c.kind, c.n) for c in ctrls}
    if len(kinds) != 1 or len(ns) != 1:
        raise ValueError("all Controls of the model must share one grid (same kind and length)")
    c = ctrls[0]
    return c.kind == "piecewise", (c.n if c.kind == "piecewise" else c.n - 1), c.t1


def _piece_flow(model, x0, t1, n_pieces, steps_per_piece, piecewise, method, idx):
    """The states after the pieces ``idx`` (static) of ``[0, t1]`` cut into ``n_pieces``.

    ``steps_per_piece`` steps of ``method`` (``jaxdyn.integrators``) in each piece, starting
    at ``k h``, with the controls frozen at the piece's midpoint (``piecewise``) or the
    time-dependent field. The loops are :func:`simulate`'s (``saved_states`` over pieces,
    ``fixed_steps`` within one).

    Args:
        model: the controlled field.
        x0: (N, d) the start.
        t1: the horizon.
        n_pieces: the pieces of ``[0, t1]``.
        steps_per_piece: the steps in each.
        piecewise: freeze the controls at each piece's midpoint.
        method: ``"rk4"`` or ``"euler"``.
        idx: the pieces after which the state is kept.

    Returns:
        (len(idx), N, d) the states.
    """
    integ = INTEGRATORS[method]()
    dtype = x0.dtype
    h = jnp.asarray(t1, dtype) / n_pieces
    dt = h / steps_per_piece

    def advance(x, k_start, n):
        def piece(x, k):
            tk = k.astype(dtype) * h
            field = model.at(tk + 0.5 * h) if piecewise else model
            return fixed_steps(integ, field, x, tk, dt, steps_per_piece), None

        x, _ = jax.lax.scan(piece, x, k_start + jnp.arange(n))
        return x

    return saved_states(x0, idx, advance)


@eqx.filter_jit
def _flow(model, x0, t1, n_intervals, steps_per_interval, piecewise, method):
    return _piece_flow(model, x0, t1, n_intervals, steps_per_interval, piecewise, method,
                       tuple(range(n_intervals + 1)))


def transfer_particles(model, x0, *, t1, steps_per_piece: int = 16, method: str = "rk4"):
    r"""Integrate the controlled particle system from ``x0`` on ``[0, t1]``.

    .. math::

        \dot x_i = A(t) x_i + b(t) + V(t) \sum_j w_{ij} x_j, \qquad
        w_{ij} \propto \exp(x_j^\top B(t) x_i)

    Piecewise-constant controls are integrated piece by piece with the controls frozen
    (no step straddles a jump); linear controls with the time-dependent field. Runs under
    ``jax.jit``, ``jax.vmap`` and ``jax.grad`` (with respect to ``x0`` and the controls).

    Args:
        model: a :class:`ControlledEuclideanAttention`, or a mapping of controls
            ``{"A", "B", "V", "b"}``.
        x0: (N, d) the initial cloud.
        t1: the horizon, finite and > 0. A traced value outside the domain gives NaN.
        steps_per_piece: fixed steps in each piece.
        method: ``"rk4"`` or ``"euler"``.

    Dtypes: ``x0`` float32 or float64, as the controls; integers are converted to the
    controls' dtype; float16, bfloat16 and complex are refused (a TypeError naming ``x0``).

    Returns:
        (n_pieces + 1, N, d): the cloud at ``t = k t1 / n_pieces``.

    Raises:
        ValueError: an unknown method, ``x0`` not (N, d), ``steps_per_piece < 1``, or a
            concrete ``t1`` that is not finite and > 0.
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if method not in ("rk4", "euler"):
        raise ValueError(f"method must be 'rk4' or 'euler', got {method!r}")
    x0 = _cloud(x0, model, "transfer_particles")
    if x0.ndim != 2 or x0.shape[1] != model.dim or x0.shape[0] < 1:
        raise ValueError(f"x0 must have shape (N, {model.dim}) with N >= 1, got {x0.shape}")
    if int(steps_per_piece) < 1:
        raise ValueError(f"steps_per_piece must be >= 1, got {steps_per_piece}")
    err, bad, t1 = _time(t1)
    if err:
        raise ValueError(err)
    piecewise, n, _ = _piece_info(model)
    return nan_where(bad, _flow(model, x0, t1, int(n), int(steps_per_piece), bool(piecewise),
                                method))


@eqx.filter_jit
def _layers(model, x0, t1, n_layers):
    # one projected-Euler step (the identity retraction in R^d) a layer, controls at the
    # layer's midpoint
    return _piece_flow(model, x0, t1, n_layers, 1, True, "euler", (0, n_layers))[-1]


def transformer_layers(model, x0, *, t1, n_layers: int):
    r"""The L-layer transformer with the controls: one explicit Euler step a layer.

    .. math::

        x_{l+1} = x_l + \frac{t_1}{L} f_l(x_l), \qquad l = 0, \dots, L - 1

    where layer l uses the controls at the midpoint of its interval ``[l t1/L, (l+1) t1/L]``
    (for piecewise-constant controls and L a multiple of n_pieces, exactly the piece the
    layer lies in). Runs under ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

    Args:
        model: a :class:`ControlledEuclideanAttention`, or a mapping of controls.
        x0: (N, d) the initial cloud.
        t1: the horizon, finite and > 0. A traced value outside the domain gives NaN.
        n_layers: L.

    Dtypes: ``x0`` float32 or float64, as the controls; integers are converted to the
    controls' dtype; float16, bfloat16 and complex are refused (a TypeError naming ``x0``).

    Returns:
        (N, d) the cloud after the last layer.

    Raises:
        ValueError: ``n_layers < 1``, ``x0`` not (N, d), or a concrete ``t1`` that is not
            finite and > 0.
    """
    if isinstance(model, Mapping):
        model = ControlledEuclideanAttention.from_controls(model)
    if int(n_layers) < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    x0 = _cloud(x0, model, "transformer_layers")
    if x0.ndim != 2 or x0.shape[1] != model.dim or x0.shape[0] < 1:
        raise ValueError(f"x0 must have shape (N, {model.dim}) with N >= 1, got {x0.shape}")
    err, bad, t1 = _time(t1)
    if err:
        raise ValueError(err)
    return nan_where(bad, _layers(model, x0, t1, int(n_layers)))


def _cloud(x0, model, fn):
    """``x0`` by the dtype rule: float32/float64 as given, integers in the controls' dtype."""
    check_dtype("x0", x0, fn=fn)
    x0 = jnp.asarray(x0)
    if jnp.issubdtype(x0.dtype, jnp.inexact):
        return x0
    dts = [a.dtype for a in jax.tree.leaves(model)
           if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.inexact)]
    return x0.astype(jnp.result_type(*dts) if dts else jnp.result_type(float))


def _time(t1):
    """``t1`` checked (finite, > 0) and as the flows take it.

    Returns:
        ``(message, bad, t1)``: the ValueError's message for a concrete ``t1`` out of its
        domain (else None), the flag of a traced one out of it (None for a concrete one), and
        ``t1`` as a Python float when concrete and scalar, else as given (1 where flagged).
    """
    err, bad = scalar_domain("t1", t1, low=0, low_open=True, what=" (the horizon)")
    if err or bad is not None:
        return err, bad, (t1 if bad is None else jnp.where(bad, 1, t1))
    return None, None, (t1 if isinstance(t1, jax.Array) else float(t1))


class CloudW2(Solution):
    r"""Result of :func:`cloud_w2_to_gaussian` (a :class:`jaxdyn.Solution`; leaves arrays).

    Reads also as the mapping it replaces: ``w["bures"]``, ``w["exact"]``, ``w["floor"]``,
    ``w["n"]``.

    Attributes:
        bures: Bures W2 between ``N(x̄, Ĉ)`` (empirical mean and covariance, 1/N) and the
            target: it compares moments only (0 for any cloud with the target's moments), its
            Monte-Carlo error decays like ``N^{-1/2}``.
        exact: W2 by optimal assignment between the cloud and N i.i.d. samples of the
            target (:func:`jaxdyn.distances.w2_exact`); it contains sampling noise. NaN when
            skipped.
        floor: the same between two independent N-samples of the target: the value
            ``exact`` would take for a perfect cloud (it decays slowly, like ``N^{-1/d}`` for
            d ≥ 3). NaN when skipped.
        result: :class:`jaxdyn.RESULTS`: ``successful``, or ``nonfinite`` when the cloud
            holds NaN/inf.
        stats: empty.
        n: the number of points N (static).
    """

    bures: Array
    exact: Array
    floor: Array
    result: RESULTS
    stats: dict
    n: int = eqx.field(static=True)

    def __getitem__(self, key: str):
        """The field ``key`` (``"bures"``, ``"exact"``, ``"floor"``, ``"n"``)."""
        if key not in ("bures", "exact", "floor", "n"):
            raise KeyError(key)
        return getattr(self, key)


def cloud_w2_to_gaussian(x, m1, S1, *, seed: int = 0, exact: bool = True,
                         exact_max: int = 2000) -> CloudW2:
    r"""Distance of a particle cloud ``x`` (N, d) to the Gaussian ``N(m1, S1)``.

    .. math::

        W_2^2\big(N(\bar x, \hat C), N(m_1, S_1)\big) = |\bar x - m_1|^2
            + \operatorname{tr}\big(\hat C + S_1 - 2 (S_1^{1/2} \hat C S_1^{1/2})^{1/2}\big)

    (the ``bures`` field), and the exact W2 against a target sample beside its sampling
    floor. The Bures part runs under ``jax.jit``/``jax.vmap``/``jax.grad`` (traced ``x``,
    ``m1``, ``S1``: pass ``exact=False``); the exact part is host-only (an assignment).

    Args:
        x: (N, d) the cloud.
        m1: (d,) the target mean.
        S1: (d, d) the target covariance.
        seed: the seed of the target samples.
        exact: compute ``exact`` and ``floor`` (when ``N ≤ exact_max``).
        exact_max: the largest N for the exact assignment (O(N³)).

    Dtypes: float32 or float64, float16 or bfloat16 (computed in at least JAX's default
    float); integers are converted to it; complex is refused (a TypeError naming the
    parameter).

    Returns:
        :class:`CloudW2`.

    Raises:
        ValueError: ``x`` is not (N, d) with N >= 1, ``m1`` not (d,) with d >= 1 or ``S1``
            not (d, d), a concrete target ``m1`` or ``S1`` that is not finite, or
            ``exact=True`` with traced inputs. (A cloud that holds NaN or inf, one whose
            dynamics diverged, or a traced target that does, gives NaN and the status
            ``nonfinite``.)
    """
    for name, a in (("x", x), ("m1", m1), ("S1", S1)):
        check_dtype(name, a, half=True, fn="cloud_w2_to_gaussian")
    check_finite("m1", m1)
    check_finite("S1", S1)
    traced = any(isinstance(a, jax.core.Tracer) for a in (x, m1, S1))
    x = jnp.asarray(x)
    dtype = jnp.promote_types(x.dtype, jnp.result_type(float))  # float64 under x64
    m1, S1, x = jnp.asarray(m1, dtype), jnp.asarray(S1, dtype), x.astype(dtype)
    if m1.ndim != 1 or m1.shape[0] < 1 or S1.shape != (m1.shape[0],) * 2:
        raise ValueError(f"m1 must have shape (d,) with d >= 1 and S1 shape (d, d), got "
                         f"{m1.shape} and {S1.shape}")
    if x.ndim != 2 or x.shape[1] != m1.shape[0] or x.shape[0] < 1:
        raise ValueError(f"x must have shape (N, {m1.shape[0]}) with N >= 1, got {x.shape}")
    n = x.shape[0]
    run_exact = exact and n <= exact_max
    if traced and run_exact:
        raise ValueError("cloud_w2_to_gaussian: the exact W2 (an assignment) needs concrete "
                         "inputs; pass exact=False under jit/vmap/grad")
    bures, finite, result = _cloud_bures(x, m1, S1)
    nan = jnp.asarray(jnp.nan, dtype)
    w_exact = w_floor = nan
    if run_exact and bool(finite):
        rng = np.random.default_rng([int(seed), 0x7A3C])  # a stream of its own
        xh, m1h, S1h = (np.asarray(a, np.float64) for a in (x, m1, S1))
        y = gaussian_cloud(rng, n, m1h, S1h)
        y2 = gaussian_cloud(rng, n, m1h, S1h)
        w_exact = jnp.asarray(w2_exact(xh, y).value, dtype)
        w_floor = jnp.asarray(w2_exact(y2, y).value, dtype)
    return CloudW2(bures=bures, exact=w_exact, floor=w_floor, result=result, stats={},
                   n=int(n))


@jax.jit
def _cloud_bures(x, m1, S1):
    """Bures W2 of the cloud's empirical moments to the target, x finite, the result code."""
    xbar = jnp.mean(x, axis=0)
    dx = x - xbar
    C = dx.T @ dx / x.shape[0]
    finite = jnp.all(jnp.isfinite(x)) & jnp.all(jnp.isfinite(m1)) & jnp.all(jnp.isfinite(S1))
    status = jnp.where(finite, status_code("successful"), status_code("nonfinite"))
    return jnp.sqrt(clipped_bures_w2_squared(xbar, C, m1, S1)), finite, from_codes(status)
