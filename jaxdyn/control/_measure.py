r"""Measure-to-measure control: depth-varying attention weights that push one cloud onto another.

A cloud ``x0`` of N particles follows an attention field whose weights θ are constant on each
of L layers ``[l h, (l+1) h)``, ``h = t1 / L``:

* ``model="sphere"`` (on S^{d-1}, Paper A): ``ẋ_i = P⊥(x_i) V_l Σ_j w_ij x_j``,
  ``w_ij ∝ exp(β_l (Q_l x_i)·(K_l x_j))``;
* ``model="euclidean"`` (in R^d, Paper B): ``ẋ_i = A_l x_i + b_l + V_l Σ_j w_ij x_j``,
  ``w_ij ∝ exp((Q_l x_i)·(K_l x_j))`` (B = K_lᵀ Q_l of :class:`jaxdyn.models.EuclideanAttention`).

Any subset of the weights is optimised (``free``; the others stay at their given values) to
minimise

    J(θ) = S_ε(μ_T, ν) + λ C(θ),

with S_ε the debiased Sinkhorn divergence (ott-jax) between the final cloud μ_T and the target
cloud ν, and C the control cost ``Σ_l |θ_{l+1} − θ_l|² / h`` (``"jump"``: ∫|θ̇|² of the
interpolation through the layers) or ``h Σ_l |θ_l|²`` (``"energy"``: ∫|θ|²).

Every layer is one ``diffrax.diffeqsolve`` of a fixed-step scheme of :mod:`jaxdyn.integrators`
(projected RK4 by default; no step straddles a layer's end) reverse-differentiated by
``diffrax.RecursiveCheckpointAdjoint``: memory grows with N·d·(layers + checkpoints), not with
the steps. Attention is :func:`jaxdyn.kernels.attend`, blocked in both passes,
so neither the forward nor the reverse pass holds an N × N matrix. The gradient of S_ε in the
points is Danskin's, ``∂S_ε/∂x_i = (2/N) (T_xx(x_i) − T_xy(x_i))`` with ``T`` the barycentric
maps of the entropic plans (x, x) and (x, y), computed by the same kernel from the Sinkhorn
potentials (the online geometry of :func:`jaxdyn.distances.w2_sinkhorn` solves them in
O(N · block) memory).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array

from .._checks import (check_bounds, check_dtype, check_integer, is_traced, nan_where, scalar_domain,
                       settings_problem, with_settings)
from .._results import RESULTS, Solution, error_if_failed, from_codes, raise_if_failed, stat
from ..distances import default_batch_size
from ..distances._rounds import _anneal_length, _round_body
from ..distances._scale import cloud_frame, times_pow2, widen_half
from ..integrators import INTEGRATORS, GridODETerm
from ..kernels._flash import K_BLOCK, Q_BLOCK, attend
from . import _optimise as driver

#: the weights of each model, in the order of the controls' dict
FAMILIES = {"sphere": ("Q", "K", "V", "beta"), "euclidean": ("Q", "K", "V", "A", "b")}
#: control costs
COSTS = ("none", "jump", "energy")

# Why the optimiser stopped (``stats["stop"]``).
REACHED, STATIONARY, BUDGET, STALLED, NONFINITE, INVALID = 0, 1, 2, 3, 4, 5
STOP_TEXT = {REACHED: "the target W2 was reached", STATIONARY: "the gradient norm met gtol",
             BUDGET: "the iteration budget ran out",
             STALLED: "the loss stopped decreasing (L-BFGS found no decrease 5 times in a row, "
                      "or its line search ended on a non-finite trial)",
             NONFINITE: "the loss or its gradient became non-finite (the last finite iterate "
                        "is returned)",
             INVALID: "a traced option was out of its domain (epsilon, epsilon_start, t1 or "
                      "adam_lr not finite and > 0, cost_weight not finite and >= 0, or gtol or "
                      "w2_tol < 0 or NaN): nothing was optimised, the start is returned"}
#: Adam steps of each jitted segment of :func:`measure_control`'s optimiser (concrete inputs;
#: L-BFGS runs one iteration a segment): the host looks (a signal, the progress) in between
SEGMENT_STEPS = 5
# L-BFGS stalls after this many iterations in a row without a relative decrease of STALL_RTOL
STALL_COUNT = 5
STALL_RTOL = 1e-12
# Sinkhorn: ε decays by this factor per iteration inside a solve (annealed from the last ε)
SINKHORN_DECAY = 0.9


# ---------------------------------------------------------------------------------------
# The controlled fields
# ---------------------------------------------------------------------------------------


def _attended(theta, x, scale, q_block, k_block):
    """(N, d): Σ_j softmax_j(scale (Q x_i)·(K x_j)) x_j, blocked (scale None: 1)."""
    q = jnp.matmul(x, theta["Q"].T)
    if scale is not None:
        q = scale * q
    k = jnp.matmul(x, theta["K"].T)
    return attend(q, k, x, jnp.zeros(x.shape[:1], x.dtype), q_block, k_block)


class _Layer(eqx.Module):
    """One layer's weights and the attention tiles; the subclasses give the field."""

    theta: dict
    q_block: int = eqx.field(static=True)
    k_block: int = eqx.field(static=True)


class _SphereLayer(_Layer):
    """One layer's field on S^{d-1}: ẋ_i = P⊥(x_i) V Σ_j softmax_j(β (Q x_i)·(K x_j)) x_j."""

    manifold = "sphere"

    def __call__(self, t, x, args=None):
        """The tangent field at x (N, d)."""
        th = self.theta
        a = jnp.matmul(_attended(th, x, th["beta"], self.q_block, self.k_block), th["V"].T)
        return a - jnp.sum(a * x, axis=-1, keepdims=True) * x


class _EuclideanLayer(_Layer):
    """One layer's field in R^d: ẋ_i = A x_i + b + V Σ_j softmax_j((Q x_i)·(K x_j)) x_j."""

    manifold = "euclidean"

    def __call__(self, t, x, args=None):
        """The field at x (N, d)."""
        th = self.theta
        m = _attended(th, x, None, self.q_block, self.k_block)
        return jnp.matmul(x, th["A"].T) + th["b"] + jnp.matmul(m, th["V"].T)


_LAYERS = {"sphere": _SphereLayer, "euclidean": _EuclideanLayer}


def repeat_layers(controls: Mapping, factor: int = 2) -> dict:
    """The same piecewise-constant controls on ``factor`` times as many layers.

    Each layer's weights are repeated ``factor`` times: the controls, as functions of time on
    ``[0, T]``, are unchanged, so a flow of depth ``factor · L`` started there is where the
    depth-L optimum ended (a continuation in depth: ``init=repeat_layers(res.controls)``).

    Args:
        controls: ``{name: (L, ...) array}``.
        factor: the repetition, an integer >= 1.

    Returns:
        ``{name: (factor · L, ...) array}``.

    Raises:
        ValueError: a factor that is not an integer >= 1.
    """
    if isinstance(factor, bool) or int(factor) != factor or int(factor) < 1:
        raise ValueError(f"factor must be an integer >= 1, got {factor!r}")
    return {k: jnp.repeat(jnp.asarray(v), int(factor), axis=0) for k, v in controls.items()}


def _check_model(model):
    if model not in FAMILIES:
        raise ValueError(f"model must be one of {tuple(FAMILIES)}, got {model!r}")


def default_controls(model: str, d: int, n_layers: int, dtype=None) -> dict:
    """The weights a layer has unless given: the identity Q, K, V, β = 1, A = 0, b = 0.

    Args:
        model: ``"sphere"`` or ``"euclidean"``.
        d: the dimension.
        n_layers: L.
        dtype: the float dtype (default: JAX's default float).

    Returns:
        ``{name: (L, ...) array}`` for every weight of the model.

    Raises:
        ValueError: an unknown model, d or L below 1.
    """
    _check_model(model)
    if int(d) < 1 or int(n_layers) < 1:
        raise ValueError(f"d and n_layers must be >= 1, got d={d}, n_layers={n_layers}")
    dtype = jnp.result_type(float) if dtype is None else dtype
    eye = np.broadcast_to(np.eye(d), (n_layers, d, d))
    out = {"Q": eye, "K": eye, "V": eye}
    if model == "sphere":
        out["beta"] = np.ones((n_layers,))
    else:
        out["A"] = np.zeros((n_layers, d, d))
        out["b"] = np.zeros((n_layers, d))
    return {k: jnp.asarray(np.array(v), dtype) for k, v in out.items()}


def _shapes(model, d, n_layers):
    """The shape of each weight's stack."""
    s = {"Q": (n_layers, d, d), "K": (n_layers, d, d), "V": (n_layers, d, d)}
    if model == "sphere":
        s["beta"] = (n_layers,)
    else:
        s.update(A=(n_layers, d, d), b=(n_layers, d))
    return s


def _full_controls(model, controls, d, n_layers, dtype):
    """The controls completed by :func:`default_controls`, checked, in one dtype."""
    out = default_controls(model, d, n_layers, dtype)
    shapes = _shapes(model, d, n_layers)
    for name, v in dict(controls or {}).items():
        if name not in shapes:
            raise ValueError(f"unknown control {name!r} for model={model!r}; "
                             f"known: {FAMILIES[model]}")
        if tuple(np.shape(v)) != shapes[name]:
            raise ValueError(f"control {name!r} must have shape {shapes[name]} (layers first), "
                             f"got {tuple(np.shape(v))}")
        out[name] = jnp.asarray(v, dtype)
    return out


def _layer_solver(method):
    if method not in INTEGRATORS:
        raise ValueError(f"method must be one of {tuple(INTEGRATORS)}, got {method!r}")
    return INTEGRATORS[method]()


def _flow(controls, x0, t1, *, model, steps_per_layer, checkpoints, method, q_block, k_block):
    """(L+1, N, d): the cloud at the layers' ends (a scan of one diffeqsolve a layer)."""
    n_layers = controls["Q"].shape[0]
    dtype = x0.dtype
    h = jnp.asarray(t1, dtype) / n_layers
    dt = h / steps_per_layer
    grid = dt * jnp.arange(steps_per_layer + 1, dtype=dtype)
    layer_cls = _LAYERS[model]
    adjoint = diffrax.RecursiveCheckpointAdjoint(checkpoints=checkpoints)

    def layer(x, theta):
        field = layer_cls(theta, q_block, k_block)
        solver = _layer_solver(method).on(field)
        sol = diffrax.diffeqsolve(
            GridODETerm(field, dt), solver, grid[0], grid[-1], None, x,
            saveat=diffrax.SaveAt(t1=True), stepsize_controller=diffrax.StepTo(grid),
            max_steps=steps_per_layer, adjoint=adjoint, throw=False)
        y = sol.ys[-1]
        return y, y

    _, xs = jax.lax.scan(layer, x0, controls)
    return jnp.concatenate([x0[None], xs], axis=0)


def _check_cloud(name, x, model, d=None):
    """Shape (and, concrete, finiteness and unit rows on the sphere) of a cloud.

    The rows of a concrete sphere cloud must be unit to :func:`jaxdyn.simulate`'s tolerance
    for the dtype they are given in (1e-8 in float64, 1e-4 in float32): the flow does not
    project them.

    Raises:
        ValueError: a wrong shape, a concrete cloud with NaN/inf or off the sphere.
    """
    from ..simulation._simulate import unit_tolerance

    check_dtype(name, x, half=True)
    shape = tuple(np.shape(x))
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1 or (d is not None and shape[1] != d):
        want = "(N, d), N, d >= 1," if d is None else f"(N, {d}), N >= 1,"
        raise ValueError(f"{name} must have shape {want}, got {shape}")
    if is_traced(x):
        return
    a = np.asarray(x, np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} holds non-finite values")
    if model == "sphere":
        dev = float(np.max(np.abs(np.linalg.norm(a, axis=1) - 1.0)))
        tol = unit_tolerance(jnp.asarray(x).dtype)
        if not dev <= tol:
            raise ValueError(f"{name} must have unit rows for model='sphere': max ||x_i| - 1| "
                             f"= {dev:.3g} > {tol:.0e} (normalise them with jaxdyn.normalize)")


def _check_flow_options(t1, steps_per_layer, checkpoints, q_block, k_block):
    """The flow's concrete options checked (t1 > 0 unless traced); the integers returned."""
    check_bounds("t1", t1, low=0.0, low_open=True, what=" (the horizon T)")
    return _check_flow_integers(steps_per_layer, checkpoints, q_block, k_block)


def _check_flow_integers(steps_per_layer, checkpoints, q_block, k_block):
    """The flow's integer options checked and returned as Python ints (checkpoints may be None)."""
    steps = check_integer("steps_per_layer", steps_per_layer, minimum=1, integral_floats=True)
    if checkpoints is not None:
        checkpoints = check_integer("checkpoints", checkpoints, minimum=1)
    q_block = check_integer("q_block", q_block, minimum=1)
    k_block = check_integer("k_block", k_block, minimum=1)
    return steps, checkpoints, q_block, k_block


def _free_names(free, model, default):
    """The free weights as a tuple: a single name may be given as a string."""
    if free is None:
        return tuple(default)
    allowed = FAMILIES[model]
    if isinstance(free, str):
        names = (free,)
    else:
        try:
            names = tuple(free)
        except TypeError:
            raise ValueError(f"free must be None, a weight's name or a sequence of names from "
                             f"{allowed}, got {free!r}") from None
    bad = [f for f in names if not isinstance(f, str) or f not in allowed]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"free must be distinct weights of model={model!r}, each one of "
                         f"{allowed}, got {free!r}")
    return names


def _positive_flag(v, strict=True):
    """Traced: whether v is finite and > 0 (``strict``) or >= 0."""
    return jnp.isfinite(v) & ((v > 0) if strict else (v >= 0))


def _float(x, name="x0"):
    """``x`` by the dtype rule (complex refused by name; integers in JAX's default float)."""
    check_dtype(name, x, half=True)
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def measure_flow(controls: Mapping, x0, *, t1: float = 1.0, model: str = "euclidean",
                 steps_per_layer: int = 4, checkpoints: Optional[int] = None,
                 method: str = "rk4", q_block: int = Q_BLOCK, k_block: int = K_BLOCK):
    r"""The cloud under layer-wise constant controls, at the end of every layer.

    .. math::

        \dot x_i = P^\perp(x_i)\, V_l \sum_j w_{ij} x_j \ \ (\text{sphere}), \qquad
        \dot x_i = A_l x_i + b_l + V_l \sum_j w_{ij} x_j \ \ (\text{euclidean}),
        \qquad t \in [l h, (l+1) h)

    ``steps_per_layer`` fixed steps of ``method`` a layer. Runs under ``jax.jit``,
    ``jax.vmap`` and ``jax.grad`` (reverse mode by diffrax's checkpointed adjoint through
    the blocked kernel: no N × N matrix). A traced ``t1`` that is not finite and > 0 gives
    an all-NaN cloud (a concrete one raises).

    Args:
        controls: ``{name: (L, ...) array}``; missing weights take :func:`default_controls`.
        x0: (N, d) the initial cloud (unit rows for ``"sphere"``, to 1e-8 in float64 and
            1e-4 in float32, as :func:`jaxdyn.simulate`'s).
        t1: the horizon T, finite and > 0.
        model: ``"sphere"`` or ``"euclidean"``.
        steps_per_layer: fixed steps in each layer, an integer >= 1.
        checkpoints: the adjoint's checkpoints a layer, an integer >= 1 (None: diffrax's
            choice for the known step count).
        method: a fixed-step scheme of :data:`jaxdyn.integrators.INTEGRATORS`.
        q_block: attention query rows per tile, an integer >= 1.
        k_block: attention keys per tile, an integer >= 1.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to JAX's default
    float; complex is refused (a TypeError naming the cloud).

    Returns:
        (L + 1, N, d): the cloud at ``t = l h``, ``l = 0, …, L``.

    Raises:
        ValueError: an unknown model or method, controls or ``x0`` of the wrong shape, a
            concrete ``x0`` that is non-finite or off the sphere, a concrete ``t1`` that is
            not finite and > 0, a step count, checkpoint count or tile size that is not an
            integer >= 1.
    """
    if model not in FAMILIES:
        raise ValueError(f"model must be one of {tuple(FAMILIES)}, got {model!r}")
    _layer_solver(method)
    x0 = _float(x0)
    _check_cloud("x0", x0, model)
    steps, checkpoints, q_block, k_block = _check_flow_options(t1, steps_per_layer, checkpoints,
                                                               q_block, k_block)
    n_layers = _n_layers(controls)
    full = _full_controls(model, controls, x0.shape[1], n_layers, x0.dtype)
    return _flow_jit(full, x0, jnp.asarray(t1, x0.dtype), model=model, steps_per_layer=steps,
                     checkpoints=checkpoints, method=method, q_block=q_block, k_block=k_block)


@eqx.filter_jit
def _flow_jit(full, x0, t1, **kw):
    # a negative T would run the grid backwards, which diffrax integrates as the forward
    # flow over |T| (GridODETerm's step is the grid's own): a horizon out of its domain
    # gives NaN instead
    ok = _positive_flag(t1)
    xs = _flow(full, x0, jnp.where(ok, t1, jnp.ones_like(t1)), **kw)
    return xs * jnp.where(ok, 1.0, jnp.nan).astype(xs.dtype)


def _n_layers(controls):
    sizes = {np.shape(v)[0] for v in dict(controls).values() if np.ndim(v) >= 1}
    if len(sizes) != 1:
        raise ValueError("controls must be a non-empty mapping of (L, ...) arrays with one L, "
                         f"got leading sizes {sorted(sizes)}")
    return sizes.pop()


# ---------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------


def _sinkhorn_options(n, m, threshold, max_iterations):
    """The Sinkhorn settings of concrete, checked options."""
    return _sinkhorn_settings(n, m, threshold, _check_sinkhorn(threshold, max_iterations))


def _check_sinkhorn(threshold, max_iterations):
    """Sinkhorn's threshold checked (concrete, > 0); its iteration budget as a Python int."""
    if is_traced(threshold):
        raise ValueError("sinkhorn_threshold must be a concrete number > 0 (it is a static "
                         "setting of the solver), got a traced value")
    check_bounds("sinkhorn_threshold", threshold, low=0.0, low_open=True)
    return check_integer("sinkhorn_max_iterations", max_iterations, minimum=1,
                         integral_floats=True)


def _sinkhorn_settings(n, m, threshold, max_iterations):
    decay = SINKHORN_DECAY
    return dict(threshold=float(threshold), max_iterations=int(max_iterations),
                batch_size=default_batch_size(n, m), decay=decay,
                momentum_start=10 * (_anneal_length(decay) // 10 + 3))


def _zero_potentials(n, m, dtype):
    z = lambda k: jnp.zeros((k,), dtype)  # noqa: E731
    return ((z(n), z(m)), (z(n), z(n)), (z(m), z(m)))


def _start_epsilon(x, y):
    """0.05 · mean(C) of the clouds solved: the ε a cold solve is annealed from (w2_sinkhorn's).

    It must be that of the clouds the solve compares (the final cloud, not ``x0``): a cold
    solve annealed from too small an ε measured its over-relaxation on the error of a
    transient, and the over-relaxed iteration could diverge (potentials of ±150 at ε = 0.02
    for clouds of spread 3, ``S_ε = −inf`` reported as converged by ott). Formed on the clouds
    brought to unit size (:func:`jaxdyn.distances._scale.cloud_frame`) and scaled back, so it
    does not overflow before the cost itself does.

    Returns:
        The ε, a scalar array.
    """
    xt, yt, e, _, _ = cloud_frame(x, y)
    mx, my = jnp.mean(xt, 0), jnp.mean(yt, 0)
    mean_cost = (jnp.mean(jnp.sum((xt - mx) ** 2, 1)) + jnp.mean(jnp.sum((yt - my) ** 2, 1))
                 + jnp.sum((mx - my) ** 2))
    return 0.05 * times_pow2(times_pow2(mean_cost, e), e)


def _divergence(x, y, eps, eps_start, pots, sk, q_block, k_block):
    """S_ε with the blocked Danskin gradient in x (``(2/N)(T_xx − T_xy)``, module doc).

    Solved on the clouds brought to unit size (centred, divided by a power of two 2^e:
    :func:`jaxdyn.distances._scale.cloud_frame`), with ε, the start ε and the potentials
    divided by 4^e; S_ε and the potentials are returned in the clouds' units (times 4^e), the
    gradient times 2^e. S_ε is translation-invariant and ``S_{s²ε}(s x, s y) = s² S_ε(x, y)``,
    so this is the same S_ε at any scale the squared cost can be represented at.

    Returns:
        (S_ε, potentials, converged, iterations): the value is the Sinkhorn round's (three
        problems, ott-jax); its derivative in x is formed by :func:`attend`.
    """
    xs, ys = jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)
    # a non-finite cloud keeps Sinkhorn's marginal error NaN, so its loops would run to their
    # budget: they solve for a zero cloud instead, and S_ε is NaN
    ok = jnp.all(jnp.isfinite(xs))
    x_ok = jnp.where(ok, xs, 0.0)
    xt, yt, e, _, _ = cloud_frame(x_ok, ys)
    to_unit = lambda v: times_pow2(v, -2 * e)  # noqa: E731
    from_unit = lambda v: times_pow2(times_pow2(v, e), e)  # noqa: E731
    eps_t = to_unit(eps)
    start = to_unit(jnp.maximum(eps_start, eps))
    pots_t = jax.tree.map(to_unit, pots)
    out = _round_body(xt, yt, eps_t, start, pots_t, **sk)

    # a solve whose over-relaxed (x, y) iteration diverged (S_ε not finite for a finite
    # cloud) is solved again from the same start without over-relaxation (momentum_start=0:
    # plain Sinkhorn). A while loop rather than a cond: under vmap it runs only when some
    # member needs it.
    def again(c):
        return jnp.int32(1), _round_body(xt, yt, eps_t, start, pots_t,
                                         **dict(sk, momentum_start=0))

    _, out = jax.lax.while_loop(lambda c: (c[0] == 0) & ok & ~jnp.isfinite(c[1][0]), again,
                                (jnp.int32(0), out))
    div_t, pots_t, conv, iters = out
    div = jnp.where(ok, from_unit(div_t), jnp.nan)
    pots_t = jax.lax.stop_gradient(pots_t)
    pots = jax.tree.map(from_unit, pots_t)
    (_, g_xy), (_, g_xx), _ = pots_t
    zero = jnp.zeros((), x.dtype)

    def bary(keys, g):  # T(x_i) = Σ_j softmax_j((g_j − |x_i − k_j|²)/ε) k_j, at unit size
        return attend(2 * xt / eps_t, keys, keys, (g - jnp.sum(keys * keys, 1)) / eps_t,
                      q_block, k_block)

    grad_t = 2.0 / x.shape[0] * (bary(xt, g_xx) - bary(yt, g_xy))
    grad = jax.lax.stop_gradient(times_pow2(grad_t, e))
    grad = jnp.where(jnp.isfinite(grad), grad, zero)
    return div + jnp.sum(grad * (x - xs)), pots, jnp.all(conv), iters[0]


def control_cost(controls: Mapping, *, t1: float = 1.0, kind: str = "jump",
                 free: Optional[Sequence[str]] = None):
    r"""The cost of layer-wise constant controls.

    .. math::

        C_{\rm jump}(θ) = \sum_{l=0}^{L-2} \frac{|θ_{l+1} − θ_l|^2}{h}, \qquad
        C_{\rm energy}(θ) = h \sum_{l=0}^{L-1} |θ_l|^2, \qquad h = T / L,

    (∫|θ̇|² of the piecewise-linear interpolation through the layers, and ∫|θ|²), summed over
    the ``free`` weights (Frobenius norms).

    Args:
        controls: ``{name: (L, ...) array}``.
        t1: the horizon T, finite and > 0 (a traced value outside that domain gives NaN).
        kind: ``"jump"``, ``"energy"`` or ``"none"`` (0).
        free: the weights summed (None: all of ``controls``).

    Returns:
        The cost, a scalar array.

    Raises:
        ValueError: an unknown kind, or a concrete ``t1`` that is not finite and > 0.
    """
    if kind not in COSTS:
        raise ValueError(f"kind must be one of {COSTS}, got {kind!r}")
    err, bad = scalar_domain("t1", t1, low=0, low_open=True, what=" (the horizon T)")
    if err:
        raise ValueError(err)
    if bad is not None:
        t1 = jnp.where(bad, 1.0, t1)
    names = tuple(controls) if free is None else tuple(free)
    total = jnp.zeros((), jnp.result_type(*[controls[n] for n in names]) if names else float)
    if kind == "none":
        return total
    for name in names:
        u = controls[name]
        n_layers = u.shape[0]
        h = t1 / n_layers
        if kind == "jump":
            total = total + jnp.sum((u[1:] - u[:-1]) ** 2) / h
        else:
            total = total + h * jnp.sum(u ** 2)
    return nan_where(bad, total)


def measure_loss(controls: Mapping, x0, target, *, t1: float = 1.0, model: str = "euclidean",
                 epsilon: float = 1e-2, cost: str = "none", cost_weight: float = 0.0,
                 free: Optional[Sequence[str]] = None, steps_per_layer: int = 4,
                 checkpoints: Optional[int] = None, method: str = "rk4",
                 sinkhorn_threshold: float = 1e-6, sinkhorn_max_iterations: int = 20000,
                 q_block: int = Q_BLOCK, k_block: int = K_BLOCK):
    r"""The control objective ``J(θ) = S_ε(μ_T, ν) + λ C(θ)`` of :func:`measure_control`.

    .. math::

        S_ε(μ, ν) = OT_ε(μ, ν) − ½ OT_ε(μ, μ) − ½ OT_ε(ν, ν)

    with μ_T the cloud of :func:`measure_flow` at T and ν the target cloud (uniform weights),
    C the :func:`control_cost` of the free weights. Differentiable in the controls (and in
    ``x0``) under ``jax.grad``; runs under ``jax.jit`` and ``jax.vmap``. The Sinkhorn solve
    starts cold (annealed from ``0.05 · mean cost`` of the final cloud and the target), so
    the value is a function of the controls up to ``sinkhorn_threshold``.

    Concrete options out of their domain raise before anything is computed. Traced ones
    (under ``jax.jit`` or ``jax.vmap``) cannot be checked on the host: where a traced
    ``epsilon`` or ``t1`` is not finite and > 0, or a traced ``cost_weight`` is not finite
    and >= 0, the loss (and its gradient) is NaN.

    Scale: S_ε is solved on the final cloud and the target centred and divided by a power of
    two 2^e that brings them to unit size, ε by 4^e, and reported times 4^e: S_ε is right at
    any scale the dtype holds ε and S_ε at (``S_{s²ε}(s x, s y) = s² S_ε(x, y)``; a shift of
    1e6 keeps the digits); where they are not representable the loss is inf or NaN.

    Dtypes: float32 and float64 ``x0`` are computed in their dtype; float16 and bfloat16 in
    float32 with a ``UserWarning`` (the loss is float32); integers are converted to JAX's
    default float; complex is refused (a TypeError naming ``x0`` or ``target``).

    Args:
        controls: ``{name: (L, ...) array}`` (missing weights: :func:`default_controls`).
        x0: (N, d) the initial cloud (unit rows for ``"sphere"``, as :func:`measure_flow`).
        target: (M, d) the target cloud (unit rows for ``"sphere"``).
        t1: the horizon T, finite and > 0.
        model: ``"sphere"`` or ``"euclidean"``.
        epsilon: the entropic ε (absolute, in squared distance units), finite and > 0.
        cost: ``"none"``, ``"jump"`` or ``"energy"``.
        cost_weight: λ, finite and >= 0.
        free: the weights the cost sums, names of the model's weights (a single name may
            be given as a string; None: those in ``controls``).
        steps_per_layer: fixed steps a layer, an integer >= 1.
        checkpoints: the adjoint's checkpoints a layer, an integer >= 1 (None: diffrax's
            choice).
        method: the fixed-step scheme.
        sinkhorn_threshold: Sinkhorn's marginal tolerance, a concrete number > 0.
        sinkhorn_max_iterations: Sinkhorn's iteration budget, an integer >= 1.
        q_block: attention query rows per tile, an integer >= 1.
        k_block: attention keys per tile, an integer >= 1.

    Returns:
        J, a scalar array (NaN for traced options out of their domain).

    Raises:
        ValueError: what :func:`measure_flow` raises, a target of another dimension, an
            unknown cost, a concrete ``epsilon``, ``cost_weight`` or ``sinkhorn_threshold``
            out of its domain, a traced ``sinkhorn_threshold``, a ``sinkhorn_max_iterations``
            that is not an integer >= 1, a ``free`` that is not a weight's name or a sequence
            of them.

    Warns:
        UserWarning: a float16 or bfloat16 ``x0`` (computed in float32).
    """
    _check_model(model)
    x0 = _float(x0)
    _check_cloud("x0", x0, model)
    _check_cloud("target", target, model, x0.shape[1])
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    steps, checkpoints, q_block, k_block = _check_flow_options(t1, steps_per_layer, checkpoints,
                                                               q_block, k_block)
    check_bounds("epsilon", epsilon, low=0.0, low_open=True)
    check_bounds("cost_weight", cost_weight, low=0.0, what=" (λ)")
    (x0,) = widen_half([x0], "measure_loss")
    sk = _sinkhorn_options(x0.shape[0], np.shape(target)[0], sinkhorn_threshold,
                           sinkhorn_max_iterations)
    n_layers = _n_layers(controls)
    full = _full_controls(model, controls, x0.shape[1], n_layers, x0.dtype)
    free = _free_names(free, model, controls)
    y = jnp.asarray(target, x0.dtype)
    return _loss_jit(full, x0, y, jnp.asarray(epsilon, x0.dtype), jnp.asarray(t1, x0.dtype),
                     jnp.asarray(cost_weight, x0.dtype), model=model, free=free, cost=cost,
                     steps_per_layer=steps, checkpoints=checkpoints, method=method,
                     q_block=q_block, k_block=k_block, sk=sk)


def _objective(full, x0, y, eps, eps_start, pots, t1, lam, *, model, free, cost,
               steps_per_layer, checkpoints, method, q_block, k_block, sk):
    """The objective at the controls ``full``.

    ``eps_start`` None: a cold solve, annealed from :func:`_start_epsilon` of the final cloud.

    Returns:
        (J, (S_ε, C, potentials, converged, Sinkhorn iterations)).
    """
    xT = _flow(full, x0, t1, model=model, steps_per_layer=steps_per_layer,
               checkpoints=checkpoints, method=method, q_block=q_block, k_block=k_block)[-1]
    if eps_start is None:
        eps_start = jax.lax.stop_gradient(_start_epsilon(xT, y))
    div, pots, conv, iters = _divergence(xT, y, eps, eps_start, pots, sk, q_block, k_block)
    c = control_cost({k: full[k] for k in free}, t1=t1, kind=cost) if free else 0.0 * div
    return div + lam * c, (div, c, pots, conv, iters)


@eqx.filter_jit
def _loss_jit(full, x0, y, eps, t1, lam, *, model, free, cost, steps_per_layer, checkpoints,
              method, q_block, k_block, sk):
    # traced options out of their domain: computed at harmless values (ε = T = 1, λ = 0),
    # answered NaN (value and gradient)
    ok = _positive_flag(eps) & _positive_flag(t1) & _positive_flag(lam, strict=False)
    one = jnp.ones((), x0.dtype)
    eps, t1, lam = jnp.where(ok, eps, one), jnp.where(ok, t1, one), jnp.where(ok, lam, 0 * one)
    pots = _zero_potentials(x0.shape[0], y.shape[0], x0.dtype)
    j = _objective(full, x0, y, eps, None, pots, t1, lam, model=model, free=free, cost=cost,
                   steps_per_layer=steps_per_layer, checkpoints=checkpoints, method=method,
                   q_block=q_block, k_block=k_block, sk=sk)[0]
    return j * jnp.where(ok, one, jnp.nan)


# ---------------------------------------------------------------------------------------
# The optimiser
# ---------------------------------------------------------------------------------------


class MeasureControlResult(Solution):
    r"""Result of :func:`measure_control` (a :class:`jaxdyn.Solution` pytree of arrays).

    Attributes:
        controls: ``{name: (L, ...) array}``, every weight of the model (the fixed ones too).
        xs: (L + 1, N, d) the cloud at the layers' ends under the returned controls.
        loss: J at the returned controls (at the final ε).
        divergence: S_ε(μ_T, ν) there.
        w2: ``sqrt(max(S_ε, 0))``: the W2 estimate at the final ε.
        cost: the control cost C (unweighted).
        epsilon: the final ε.
        loss_history: J after the start and each iteration (Adam, then L-BFGS; NaN after the
            last), each at that iteration's ε.
        w2_history: ``sqrt(max(S_ε, 0))`` along the same iterations.
        epsilon_history: ε along the same iterations.
        result: :class:`jaxdyn.RESULTS`: ``successful`` (the gradient norm met ``gtol`` or
            W2 met ``w2_tol``, and the final Sinkhorn solve converged), ``not_converged``
            (the budget ran out, L-BFGS stalled, or Sinkhorn did not meet its threshold),
            ``nonfinite`` (the loss or gradient became NaN/inf: the last finite iterate is
            returned), ``invalid_input`` (a traced option out of its domain: nothing was
            optimised, the controls are the start, the values NaN).
        stats: ``num_steps`` (iterations taken, the start excluded), ``num_accepted_steps``
            (iterations whose update was applied), ``iterations``, ``grad_norm`` (at the
            returned controls, of the optimised parameters), ``stop`` (why the optimiser
            stopped: ``STOP_TEXT``), ``sinkhorn_converged``, ``sinkhorn_iterations`` (of
            the final (x, y) solve).
        model: ``"sphere"`` or ``"euclidean"`` (static).
        free: the optimised weights (static).
        t1: the horizon T (static; NaN where ``t1`` was traced).
    """

    controls: dict
    xs: Array
    loss: Array
    divergence: Array
    w2: Array
    cost: Array
    epsilon: Array
    loss_history: Array
    w2_history: Array
    epsilon_history: Array
    result: RESULTS
    stats: dict
    model: str = eqx.field(static=True, default="euclidean")
    free: tuple = eqx.field(static=True, default=())
    t1: float = eqx.field(static=True, default=1.0)

    num_steps = stat("num_steps", "Optimiser iterations taken (the start excluded).")
    num_accepted_steps = stat("num_accepted_steps", "Iterations whose update was applied.")

    @property
    def message(self) -> str:
        """Why the optimiser stopped, and the status (a concrete result)."""
        stop = int(np.asarray(self.stats["stop"]))
        return (f"{STOP_TEXT.get(stop, 'unknown')}; W2 ≈ {float(self.w2):.4g} at ε = "
                f"{float(self.epsilon):.3g} after {int(np.asarray(self.stats['iterations']))} "
                f"iterations; status {self.names}")


def _to_raw(free_ctrl):
    """The optimiser's parameters: β as log β (it stays positive), the others as they are."""
    return {k: (jnp.log(v) if k == "beta" else v) for k, v in free_ctrl.items()}


def _from_raw(raw):
    return {k: (jnp.exp(v) if k == "beta" else v) for k, v in raw.items()}


@dataclasses.dataclass(frozen=True)
class MeasureControlOptions:
    """Settings of :func:`measure_control`: ``measure_control(x0, y, n_layers=L, options=...)``.

    Each field can also be passed to :func:`measure_control` as a keyword, which replaces
    that field of the options given (kept for scripts that pass keywords).

    Concrete values are checked when the options are made (``ValueError`` naming the field);
    the numbers may be traced (under ``jax.jit`` or ``jax.vmap``: see :func:`measure_control`),
    the integers, strings and ``sinkhorn_threshold`` must be concrete.

    Attributes:
        free: the optimised weights, distinct names of the model's weights (a single name
            may be given as a string; default: all of the model's).
        init: starting values ``{name: (L, ...) array}`` (default :func:`default_controls`
            plus, for the free weights without a given start, N(0, init_scale²) entries; β
            times exp of such a draw).
        init_scale: the scale of the random start, finite and >= 0 (0: no random start).
        seed: the seed of the random start (NumPy, on the host), an integer >= 0.
        epsilon: the final entropic ε (absolute, squared distance units), finite and > 0.
        epsilon_start: the ε of the start, finite and > 0 (default 10 ε).
        cost: ``"none"``, ``"jump"`` (∫|θ̇|²) or ``"energy"`` (∫|θ|²).
        cost_weight: λ, finite and >= 0.
        adam_steps: Adam iterations, an integer >= 0.
        adam_lr: Adam's initial learning rate, finite and > 0 (cosine-decayed to 5 % of it).
        lbfgs_steps: L-BFGS iterations at most, an integer >= 0.
        gtol: the stationarity tolerance, >= 0.
        w2_tol: stop once W2 ≤ w2_tol, >= 0 (0: never).
        steps_per_layer: fixed steps a layer, an integer >= 1.
        checkpoints: the adjoint's checkpoints a layer, an integer >= 1 (None: diffrax's
            choice).
        method: the fixed-step scheme (``"rk4"``, ``"euler"``, ...).
        sinkhorn_threshold: Sinkhorn's marginal tolerance, a concrete number > 0.
        sinkhorn_max_iterations: Sinkhorn's iteration budget per solve, an integer >= 1.
        q_block: attention query rows per tile, an integer >= 1.
        k_block: attention keys per tile, an integer >= 1.
        throw: raise when the result is not successful (``RuntimeError`` for concrete
            inputs, ``eqx.error_if`` under a transformation).
        segment_steps: Adam steps of each jitted segment, an integer >= 1 (L-BFGS runs one
            iteration a segment; under ``jax.jit`` or ``jax.vmap`` each phase is one
            segment). The boundaries depend only on it and the budgets, never on the clock:
            the values are the same whoever watches.
        callback: called on the host after the start and each segment with
            ``(iterations done, iteration budget, loss at the last iteration)`` (concrete
            inputs only).
    """

    free: Optional[Union[str, Sequence[str]]] = None
    init: Optional[Mapping] = None
    init_scale: float = 0.1
    seed: int = 0
    epsilon: float = 1e-2
    epsilon_start: Optional[float] = None
    cost: str = "none"
    cost_weight: float = 0.0
    adam_steps: int = 200
    adam_lr: float = 0.05
    lbfgs_steps: int = 100
    gtol: float = 1e-6
    w2_tol: float = 0.0
    steps_per_layer: int = 4
    checkpoints: Optional[int] = None
    method: str = "rk4"
    sinkhorn_threshold: float = 1e-6
    sinkhorn_max_iterations: int = 20000
    q_block: int = Q_BLOCK
    k_block: int = K_BLOCK
    throw: bool = False
    segment_steps: int = SEGMENT_STEPS
    callback: Optional[Callable] = None

    def __post_init__(self):
        _checked_options(self)


def _checked_options(o: MeasureControlOptions) -> dict:
    """The model-independent options checked; their integers as Python ints.

    Returns:
        ``{"steps_per_layer", "checkpoints", "q_block", "k_block", "adam_steps", "lbfgs_steps",
        "segment_steps", "sinkhorn_max_iterations", "seed"}``.

    Raises:
        ValueError: an unknown method or cost, a concrete number out of its domain (the
            field named), an integer option that is not an integer in its range, a traced
            ``sinkhorn_threshold``.
    """
    _layer_solver(o.method)
    if o.cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {o.cost!r}")
    ints = dict(zip(("steps_per_layer", "checkpoints", "q_block", "k_block"),
                    _check_flow_integers(o.steps_per_layer, o.checkpoints, o.q_block,
                                         o.k_block)))
    for name, low in (("adam_steps", 0), ("lbfgs_steps", 0), ("segment_steps", 1)):
        ints[name] = check_integer(name, getattr(o, name), minimum=low, integral_floats=True)
    ints["sinkhorn_max_iterations"] = _check_sinkhorn(o.sinkhorn_threshold,
                                                      o.sinkhorn_max_iterations)
    for name in ("epsilon", "epsilon_start", "adam_lr"):
        check_bounds(name, getattr(o, name), low=0.0, low_open=True)
    check_bounds("cost_weight", o.cost_weight, low=0.0, what=" (λ)")
    check_bounds("init_scale", o.init_scale, low=0.0)
    for name in ("gtol", "w2_tol"):  # +inf: stop at once
        v = getattr(o, name)
        if not is_traced(v) and not float(v) >= 0:
            raise ValueError(f"{name} must be >= 0, got {v!r}")
    ints["seed"] = check_integer("seed", o.seed, minimum=0)
    return ints


def _start_controls(o: MeasureControlOptions, model, free, seed, d, n_layers, dtype):
    """Every weight at the start: ``init``, else the defaults plus a random draw for the free ones.

    Returns:
        ``{name: (L, ...) array}`` for every weight of the model.

    Raises:
        ValueError: starting values of the wrong shape or name, a concrete β start <= 0.
    """
    init = dict(o.init or {})
    full = _full_controls(model, init, d, n_layers, dtype)
    rng = np.random.default_rng(int(seed))
    shapes = _shapes(model, d, n_layers)
    for name in free:  # a random start for the free weights not given
        if name in init:
            continue
        draw = o.init_scale * rng.standard_normal(shapes[name])
        full[name] = (full[name] * jnp.asarray(np.exp(draw), dtype) if name == "beta"
                      else full[name] + jnp.asarray(draw, dtype))
    if model == "sphere":
        beta = full["beta"]
        if not isinstance(beta, jax.core.Tracer) and not np.all(np.asarray(beta) > 0):
            raise ValueError("the start's beta must be > 0 in every layer")
    return full


def measure_control(x0, target, *, n_layers: int, model: str = "euclidean", t1: float = 1.0,
                    options: Optional[MeasureControlOptions] = None,
                    **settings) -> MeasureControlResult:
    r"""Optimise layer-wise constant attention weights that push the cloud ``x0`` onto ``target``.

    .. math::

        \min_θ\ S_ε(μ_T^θ, ν) + λ\, C(θ)

    (module doc; :func:`measure_loss`). The Adam → L-BFGS driver shared with
    :func:`reach` (:mod:`jaxdyn.control._optimise`) runs jitted segments of at most
    ``segment_steps`` iterations, the optimiser's state carried by the host from one to the
    next (a signal stops it between two segments; ``callback`` reports the progress there): a
    cold Sinkhorn solve at the start, ``adam_steps`` of Adam (a cosine-decayed learning rate,
    non-finite gradients skipped) while ε is annealed geometrically from ``epsilon_start`` to
    ``epsilon`` over the first half of them (each Sinkhorn solve warm-started from the last
    potentials), then up to ``lbfgs_steps`` of ``optax.lbfgs`` with its zoom line search at
    the final ε (every evaluation warm-started from the potentials the Adam phase ended
    with and annealed from ``epsilon_start``, so that the line search sees one
    deterministic function). β is optimised as log β. Stops early when the gradient norm ≤
    ``gtol · max(1, |J|)`` (stationary) or W2 ≤ ``w2_tol`` (reached).

    Concrete options out of their domain raise before anything is computed. Under
    ``jax.jit`` or ``jax.vmap`` a traced ``epsilon``, ``epsilon_start``, ``t1`` or
    ``adam_lr`` that is not finite and > 0, a traced ``cost_weight`` that is not finite and
    >= 0, or a traced ``gtol`` or ``w2_tol`` below 0 (or NaN) gives the status
    ``invalid_input`` (``stats["stop"]`` = ``INVALID``): nothing is optimised.

    Args:
        x0: (N, d) the initial cloud (unit rows for ``"sphere"``, to 1e-8 in float64 and
            1e-4 in float32, as :func:`jaxdyn.simulate`'s: they are not projected).
        target: (M, d) the target cloud (unit rows for ``"sphere"``).
        n_layers: L, the layers (pieces of the controls), an integer >= 1.
        model: ``"sphere"`` (weights Q, K, V, β) or ``"euclidean"`` (Q, K, V, A, b).
        t1: the horizon T, finite and > 0.
        options: a :class:`MeasureControlOptions`, the settings of the run (default: its
            defaults): ``options=MeasureControlOptions(free=("V", "b"), epsilon=0.05)``.
        **settings: any field of :class:`MeasureControlOptions` by name (``free``,
            ``epsilon``, ``adam_steps``, ``callback``, ...), kept for scripts that pass
            keywords. Precedence: a keyword replaces that field of ``options``
            (``dataclasses.replace(options, **settings)``); the fields given neither way
            take the defaults of :class:`MeasureControlOptions`.

    Returns:
        :class:`MeasureControlResult`.

    Raises:
        ValueError: an unknown model, a free weight the model lacks, clouds or starting
            values of the wrong shape, concrete clouds that are non-finite or off the
            sphere, a concrete ``t1`` or ``n_layers`` out of its domain, what
            :class:`MeasureControlOptions` raises.
        TypeError: ``options`` that are not :class:`MeasureControlOptions`, a keyword
            that is not one of its fields.

    With ``throw=True`` a concrete unsuccessful result raises ``RuntimeError`` with its
    status message.
    """
    problem = settings_problem(MeasureControlOptions, options, settings, "measure_control")
    if problem:
        raise TypeError(problem)
    o = with_settings(MeasureControlOptions, options, settings)  # keywords win
    _check_model(model)
    ints = _checked_options(o)
    x0, y, n_layers = _checked_problem(x0, target, n_layers, t1, model)
    free = _free_names(o.free, model, FAMILIES[model])
    if not free:
        raise ValueError(f"free must name at least one weight of {FAMILIES[model]}, got "
                         f"{free!r}")
    args, static = _problem(o, ints, model, free, x0, y, n_layers, t1)
    # under a transformation the loop cannot be watched: one segment each phase
    traced = any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(args))
    res = _optimise(args, static, float(t1) if not is_traced(t1) else math.nan,
                    ints["segment_steps"], None if traced else o.callback, traced)
    if o.throw:
        if isinstance(res.loss, jax.core.Tracer):
            res = eqx.tree_at(lambda r: r.loss, res, error_if_failed(res.loss, res.result))
        else:
            raise_if_failed(res, "measure_control")
    return res


def _checked_problem(x0, target, n_layers, t1, model):
    """The clouds (in one float dtype) and L, checked (a ValueError naming what is wrong).

    Returns:
        ``(x0, target, n_layers)``.
    """
    x0 = _float(x0)
    _check_cloud("x0", x0, model)
    _check_cloud("target", target, model, x0.shape[1])
    y = jnp.asarray(target, x0.dtype)
    n_layers = check_integer("n_layers", n_layers, minimum=1, integral_floats=True)
    check_bounds("t1", t1, low=0.0, low_open=True, what=" (the horizon T)")
    return x0, y, n_layers


def _problem(o, ints, model, free, x0, y, n_layers, t1):
    """The optimiser's ``(args, static)``: the start and traced options, the static options."""
    dtype = x0.dtype
    full = _start_controls(o, model, free, ints["seed"], x0.shape[1], n_layers, dtype)
    eps_start = 10.0 * o.epsilon if o.epsilon_start is None else o.epsilon_start
    arr = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    args = (full, x0, y, arr(o.epsilon), arr(eps_start), arr(t1), arr(o.cost_weight),
            arr(o.adam_lr), arr(o.gtol), arr(o.w2_tol))
    static = dict(model=model, free=free, cost=o.cost, adam_steps=ints["adam_steps"],
                  lbfgs_steps=ints["lbfgs_steps"], steps_per_layer=ints["steps_per_layer"],
                  checkpoints=ints["checkpoints"], method=o.method, q_block=ints["q_block"],
                  k_block=ints["k_block"],
                  sk=_sinkhorn_settings(x0.shape[0], y.shape[0], o.sinkhorn_threshold,
                                        ints["sinkhorn_max_iterations"]))
    return args, static


class _Setup:
    """The optimiser's pieces for one problem (built inside each of its jitted segments).

    Traced options out of their domain: nothing is optimised (the Adam steps are skipped,
    L-BFGS takes no step), the evaluations run at harmless values (ε = T = lr = 1, λ = 0) and
    the result is invalid_input with NaN values.
    """

    def __init__(self, full, x0, y, eps_final, eps_first, t1, lam, lr, gtol, w2_tol, *, model,
                 free, cost, adam_steps, lbfgs_steps, steps_per_layer, checkpoints, method,
                 q_block, k_block, sk):
        dtype = self.dtype = x0.dtype
        self.eps_given = eps_final
        self.valid = (_positive_flag(eps_final) & _positive_flag(eps_first) & _positive_flag(t1)
                      & _positive_flag(lr) & _positive_flag(lam, strict=False) & (gtol >= 0)
                      & (w2_tol >= 0))
        one = self.one = jnp.ones((), dtype)
        eps_final, eps_first, t1, lr = (jnp.where(self.valid, v, one)
                                        for v in (eps_final, eps_first, t1, lr))
        lam, gtol, w2_tol = (jnp.where(self.valid, v, 0 * one) for v in (lam, gtol, w2_tol))
        self.eps_final, self.eps_first, self.t1, self.lam = eps_final, eps_first, t1, lam
        self.gtol, self.w2_tol = gtol, w2_tol
        self.full, self.x0, self.y, self.free, self.cost = full, x0, y, free, cost
        self.adam_steps, self.lbfgs_steps = adam_steps, lbfgs_steps
        self.fixed = {k: v for k, v in full.items() if k not in free}
        self.z0, self.unravel = ravel_pytree(_to_raw({k: full[k] for k in free}))
        self.kw = dict(model=model, free=free, cost=cost, steps_per_layer=steps_per_layer,
                       checkpoints=checkpoints, method=method, q_block=q_block, k_block=k_block,
                       sk=sk)
        self.vg = jax.value_and_grad(self.objective, has_aux=True)
        # Adam, ε annealed geometrically over the first half of the steps
        self.anneal = max(1, adam_steps // 2)
        sched = optax.cosine_decay_schedule(1.0, max(1, adam_steps), alpha=0.05)
        self.adam = driver.adam(lambda k: lr * sched(k))
        self.lbfgs = driver.lbfgs()

    def controls_of(self, z):  # (the line search's trials may come in another float type)
        return {**self.fixed, **_from_raw(self.unravel(jnp.asarray(z, self.dtype)))}

    def objective(self, z, eps, eps_start, pots):
        return _objective(self.controls_of(z), self.x0, self.y, eps, eps_start, pots, self.t1,
                          self.lam, **self.kw)

    def cost_of(self, zz):
        if not self.free:
            return jnp.zeros((), self.dtype)
        return control_cost({k: self.controls_of(zz)[k] for k in self.free}, t1=self.t1,
                            kind=self.cost)

    def start(self):
        """The start: a cold solve at the first ε (annealed from the start's final cloud)."""
        n, m, dtype = self.x0.shape[0], self.y.shape[0], self.dtype
        nan_hist = jnp.full((1 + self.adam_steps + self.lbfgs_steps,), jnp.nan, dtype)
        first = self.eps_final if self.adam_steps == 0 else self.eps_first
        z0 = self.z0
        j0, (div0, _, pots, _, _) = self.objective(z0, first, None, _zero_potentials(n, m, dtype))
        hist = (nan_hist.at[0].set(j0), nan_hist.at[0].set(_w2_of(div0)),
                nan_hist.at[0].set(first))
        return _AdamCarry(z0, self.adam.init(z0), pots, first, jnp.int32(0), hist, z0)

    def adam_steps_between(self, carry, k0, k1):
        """Adam steps ``k0 … k1 − 1`` (none for invalid options)."""
        dtype, eps_first, eps_final = self.dtype, self.eps_first, self.eps_final

        def adam_step(k, carry):
            z, state, pots, eps_prev, accepted, hist, good = carry
            frac = jnp.minimum(k.astype(dtype) / self.anneal, 1.0)
            eps = eps_first * (eps_final / eps_first) ** frac
            (j, (div, _, new_pots, _, _)), g = self.vg(z, eps, eps_prev, pots)
            finite = jnp.isfinite(j) & jnp.all(jnp.isfinite(g))
            upd, state = self.adam.update(g, state, z)
            z_new = optax.apply_updates(z, upd)
            pots = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new_pots, pots)
            hist = (hist[0].at[k + 1].set(j), hist[1].at[k + 1].set(_w2_of(div)),
                    hist[2].at[k + 1].set(eps))
            # a run of non-finite steps leaves z at the last finite iterate (apply_if_finite)
            return _AdamCarry(jnp.where(finite, z_new, z), state, pots, eps, accepted + finite,
                              hist, jnp.where(finite, z, good))

        return jax.lax.cond(self.valid, lambda c: jax.lax.fori_loop(k0, k1, adam_step, c),
                            lambda c: c, carry)

    def lbfgs_start(self, carry):
        """L-BFGS's carry after the Adam phase, and the fixed warm potentials of its function."""
        z, _, pots, _, accepted, hist, good = carry
        # strong types (optax's initial state holds weak-typed scalars, the loop's output
        # none): every segment then has one signature, one program
        state = jax.tree.map(lambda a: jax.lax.convert_element_type(a, a.dtype),
                             self.lbfgs.init(z))
        return _LbfgsCarry(z, state, jnp.int32(0), jnp.int32(0), jnp.int32(-1), accepted, hist,
                           good), pots

    def lbfgs_until(self, c, pots_fixed, it_end):
        """L-BFGS iterations at the final ε until ``it_end`` of them (or a stop)."""
        lam, eps_final, adam_steps = self.lam, self.eps_final, self.adam_steps
        lbfgs, cost_of = self.lbfgs, self.cost_of

        def value(zz):  # annealed from the first ε: the cloud has moved since the potentials
            return self.objective(zz, eps_final, self.eps_first, pots_fixed)[0]

        vg_state = optax.value_and_grad_from_state(value)

        def body(c):
            z, state, it, stall, stop, accepted, hist, last = c
            j, g = vg_state(z, state=state)
            gnorm = jnp.linalg.norm(g)
            finite = jnp.isfinite(j) & jnp.all(jnp.isfinite(g))
            div = j - lam * cost_of(z)
            w2 = _w2_of(div)
            stationary = gnorm <= self.gtol * jnp.maximum(1.0, jnp.abs(j))
            reached = _reached(w2, self.w2_tol)
            z_new, new_state, j_new, g_new, trial_ok = driver.lbfgs_iteration(lbfgs, z, state, j,
                                                                              g, value)
            # a line search that ended on a non-finite trial found no usable step: stalled
            decreased = trial_ok & (j_new < j - STALL_RTOL * jnp.abs(j))
            stall = jnp.where(decreased, 0, stall + 1).astype(jnp.int32)
            stall = jnp.where(trial_ok, stall, STALL_COUNT).astype(jnp.int32)
            stop = jnp.where(~finite, NONFINITE, jnp.where(
                reached, REACHED, jnp.where(stationary, STATIONARY,
                                            jnp.where(stall >= STALL_COUNT, STALLED, -1))))
            stop = stop.astype(jnp.int32)
            go = finite & ~reached & ~stationary & trial_ok
            k = 1 + adam_steps + it
            hist = (hist[0].at[k].set(jnp.where(go, j_new, j)),
                    hist[1].at[k].set(jnp.where(go, _w2_of(j_new - lam * cost_of(z_new)), w2)),
                    hist[2].at[k].set(eps_final))
            z_next = jnp.where(go, z_new, z)
            state = jax.tree.map(lambda a, b: jnp.where(go, a, b), new_state, state)
            return _LbfgsCarry(z_next, state, it + go.astype(jnp.int32), stall, stop,
                               accepted + (go & decreased), hist, jnp.where(finite, z, last))

        return driver.segment_loop(body, c, jnp.minimum(self.lbfgs_steps, it_end),
                                   lambda c: (c.stop < 0) & self.valid)

    def finish(self, c, pots_fixed, t1_static):
        """The result: the returned controls evaluated once more at the final ε."""
        z, _, it, _, stop, accepted, hist, last = c
        stop = jnp.where(stop < 0, BUDGET, stop).astype(jnp.int32)
        if self.lbfgs_steps == 0:
            stop = jnp.int32(BUDGET)
        z = jnp.where(stop == NONFINITE, last, z)
        ctrl = self.controls_of(z)
        (j, (div, cst, _, conv, sk_it)), g = self.vg(z, self.eps_final, self.eps_first,
                                                     pots_fixed)
        gnorm = jnp.linalg.norm(g)
        kw = self.kw
        xs = _flow(ctrl, self.x0, self.t1, model=kw["model"],
                   steps_per_layer=kw["steps_per_layer"], checkpoints=kw["checkpoints"],
                   method=kw["method"], q_block=kw["q_block"], k_block=kw["k_block"])
        w2 = _w2_of(div)
        stationary = gnorm <= self.gtol * jnp.maximum(1.0, jnp.abs(j))
        good_end = (stationary | _reached(w2, self.w2_tol)) & conv
        finite = jnp.isfinite(j) & jnp.all(jnp.isfinite(xs))
        stop = jnp.where(finite, stop, NONFINITE).astype(jnp.int32)
        status = jnp.where(~finite | (stop == NONFINITE), _code("nonfinite"),
                           jnp.where(good_end, _code("successful"), _code("not_converged")))
        valid = self.valid
        iterations = jnp.int32(self.adam_steps) + it
        stop = jnp.where(valid, stop, INVALID).astype(jnp.int32)
        status = jnp.where(valid, status, _code("invalid_input"))
        iterations = jnp.where(valid, iterations, 0).astype(jnp.int32)
        accepted = jnp.where(valid, accepted, 0).astype(jnp.int32)
        nan = jnp.where(valid, self.one, jnp.nan)  # the values at harmless options are not answers
        j, div, w2, cst, gnorm, xs = (v * nan for v in (j, div, w2, cst, gnorm, xs))
        hist = tuple(h * nan for h in hist)
        return MeasureControlResult(
            controls=ctrl, xs=xs, loss=j, divergence=div, w2=w2, cost=cst,
            epsilon=self.eps_given,
            loss_history=hist[0], w2_history=hist[1], epsilon_history=hist[2],
            result=from_codes(status),
            stats={"num_steps": iterations, "num_accepted_steps": accepted,
                   "iterations": iterations, "grad_norm": gnorm, "stop": stop,
                   "sinkhorn_converged": conv, "sinkhorn_iterations": sk_it},
            model=kw["model"], free=tuple(self.free), t1=t1_static)


class _AdamCarry(NamedTuple):
    """The Adam phase's state between segments."""

    z: Any  # the free controls, raveled
    state: Any  # optax's Adam state
    pots: Any  # the warm Sinkhorn potentials
    eps: Any  # the ε of the last step
    accepted: Any  # finite steps taken
    hist: Any  # (loss, W2, ε) histories
    good: Any  # the last finite iterate


class _LbfgsCarry(NamedTuple):
    """The L-BFGS phase's state between segments."""

    z: Any
    state: Any  # optax's L-BFGS state
    it: Any  # iterations taken
    stall: Any  # iterations in a row without a decrease
    stop: Any  # the stop code, -1 while running
    accepted: Any
    hist: Any
    last: Any  # the last finite iterate


def _w2_of(div):
    return jnp.sqrt(jnp.maximum(div, 0.0))


def _reached(w2, w2_tol):
    """Whether W2 met ``w2_tol``; with ``w2_tol = 0`` never.

    A divergence that rounds to 0 or below it, or an annealed estimate off its fixed point, is
    no proof that the target was reached.

    Returns:
      Boolean array.
    """
    return (w2_tol > 0) & (w2 <= w2_tol)


# The optimiser's jitted parts: each builds its :class:`_Setup` from the same arguments
# (``args``: the controls, clouds and traced options; ``static``: the static options).


@eqx.filter_jit
def _opt_start(args, static):
    return _Setup(*args, **static).start()


@eqx.filter_jit
def _opt_adam(carry, k0, k1, args, static):
    return _Setup(*args, **static).adam_steps_between(carry, k0, k1)


@eqx.filter_jit
def _opt_lbfgs_start(carry, args, static):
    return _Setup(*args, **static).lbfgs_start(carry)


@eqx.filter_jit
def _opt_lbfgs(c, pots, it_end, args, static):
    return _Setup(*args, **static).lbfgs_until(c, pots, it_end)


@eqx.filter_jit
def _opt_finish(c, pots, args, static, t1_static):
    return _Setup(*args, **static).finish(c, pots, t1_static)


def _optimise(args, static, t1_static, segment, callback, traced):
    """Start, Adam, L-BFGS and the result, as jitted segments run by the shared driver.

    ``segment`` Adam steps or one L-BFGS iteration a segment; ``traced``: each phase one
    segment, no callback. Between two segments :func:`jaxdyn.control._optimise.drive` hands
    the host a signal (``KeyboardInterrupt``) and ``callback(done, total, loss)`` the
    iterations done.

    Returns:
        The :class:`MeasureControlResult`.
    """
    adam_steps, lbfgs_steps = static["adam_steps"], static["lbfgs_steps"]
    total = adam_steps + lbfgs_steps
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731 - traced bounds: one program

    def report(carry, done):
        if callback is not None:
            callback(int(done), total, float(carry.hist[0][done]))

    def adam(carry, done, end):
        return _opt_adam(carry, i32(done), i32(end), args, static), end, traced

    def lbfgs(c, done, end):  # one iteration a segment (its line search: up to 16 solves)
        c = _opt_lbfgs(c, pots, i32(end - adam_steps), args, static)
        return (c, end, True) if traced else (c, adam_steps + int(c.it), int(c.stop) >= 0)

    carry = _opt_start(args, static)
    report(carry, 0)
    carry = driver.drive(adam, carry, done=0, budget=adam_steps,
                         segment=max(adam_steps, 1) if traced else segment, report=report)
    c, pots = _opt_lbfgs_start(carry, args, static)
    c = driver.drive(lbfgs, c, done=adam_steps, budget=total,
                     segment=max(lbfgs_steps, 1) if traced else 1, report=report)
    return _opt_finish(c, pots, args, static, t1_static)


def _code(name):
    from .._results import status_code

    return jnp.int32(status_code(name))


# ---------------------------------------------------------------------------------------
# Replays: jaxdyn's own models, the moment ODE
# ---------------------------------------------------------------------------------------


def layer_models(controls: Mapping, *, model: str = "euclidean", kernel: str = "auto"):
    """One :mod:`jaxdyn.models` field a layer, from layer-wise controls.

    ``model="sphere"``: ``SphereAttention(Q_l, K_l, V_l, β_l)`` (B = Q_lᵀ K_l);
    ``"euclidean"``: ``EuclideanAttention(A_l, K_lᵀ Q_l, V_l, b_l)``.

    Args:
        controls: ``{name: (L, ...) array}`` (missing weights: :func:`default_controls`).
        model: ``"sphere"`` or ``"euclidean"``.
        kernel: the models' attention kernel (``"dense"``, ``"blocked"``, ``"auto"``).

    Returns:
        A list of L models.

    Raises:
        ValueError: an unknown model, controls of the wrong shape.
    """
    from ..models import EuclideanAttention, SphereAttention

    if model not in FAMILIES:
        raise ValueError(f"model must be one of {tuple(FAMILIES)}, got {model!r}")
    n_layers = _n_layers(controls)
    d = int(np.shape(controls.get("Q", controls.get("V", controls.get("A"))))[-1])
    dtype = jnp.result_type(*[jnp.asarray(v) for v in controls.values()])
    c = _full_controls(model, controls, d, n_layers, dtype)
    out = []
    for l in range(n_layers):
        if model == "sphere":
            out.append(SphereAttention(c["Q"][l], c["K"][l], c["V"][l], c["beta"][l],
                                       kernel=kernel))
        else:
            out.append(EuclideanAttention(c["A"][l], c["K"][l].T @ c["Q"][l], c["V"][l],
                                          c["b"][l], kernel=kernel))
    return out


def replay(controls: Mapping, x0, *, t1: float = 1.0, model: str = "euclidean",
           steps_per_layer: int = 16, method: str = "rk4", kernel: str = "auto"):
    r"""The cloud under the controls, integrated by :func:`jaxdyn.simulate` layer by layer.

    An independent integration of :func:`measure_flow`'s dynamics (jaxdyn's models and
    kernels, any step count): replaying optimised controls at a finer step checks that the
    optimisation did not exploit the discretisation. Concrete inputs (one ``simulate`` a
    layer).

    Args:
        controls: ``{name: (L, ...) array}``.
        x0: (N, d) the initial cloud.
        t1: the horizon T.
        model: ``"sphere"`` or ``"euclidean"``.
        steps_per_layer: steps a layer.
        method: any method of :func:`jaxdyn.simulate`.
        kernel: the models' attention kernel.

    Dtypes: float32 or float64, float16 or bfloat16; integers are converted to JAX's default
    float; complex is refused (a TypeError naming the cloud).

    Returns:
        (L + 1, N, d): the cloud at the layers' ends.

    Raises:
        TypeError: a traced ``t1`` (the replay runs one ``simulate`` a layer on the host).
        ValueError: a ``t1`` that is not finite and > 0, and what :func:`layer_models` and
            :func:`jaxdyn.simulate` raise.
    """
    from ..simulation import simulate

    if is_traced(t1):
        raise TypeError("replay: t1 must be a concrete number (the replay runs one simulate a "
                        "layer on the host); got a traced value")
    err, _ = scalar_domain("t1", t1, low=0, low_open=True, what=" (the horizon T)")
    if err:
        raise ValueError(f"replay: {err}")

    if isinstance(steps_per_layer, bool) or int(steps_per_layer) < 1:
        raise ValueError(f"steps_per_layer must be an integer >= 1, got {steps_per_layer!r}")
    models = layer_models(controls, model=model, kernel=kernel)
    h = float(t1) / len(models)
    check_dtype("x0", x0, half=True, fn="replay")
    x = jnp.asarray(x0, models[0].V.dtype)
    xs = [x]
    for l, mdl in enumerate(models):
        traj = simulate(mdl, x, t0=l * h, t1=(l + 1) * h, dt=h / steps_per_layer,
                        saveat=[l * h + h], method=method)
        x = traj.xs[-1]
        xs.append(x)
    return jnp.stack(xs)


def moment_controls(controls: Mapping, *, t1: float = 1.0) -> dict:
    r"""The Euclidean controls as :class:`jaxdyn.models.Control`\ s of the moment ODE.

    ``{"A", "B" = KᵀQ, "V", "b"}``, piecewise constant on the L layers of ``[0, t1]``, for
    :func:`jaxdyn.gaussian.solve_moments` (a Gaussian cloud under these controls follows the
    moments up to sampling error).

    Args:
        controls: ``{name: (L, ...) array}`` of the ``"euclidean"`` model.
        t1: the horizon T.

    Returns:
        ``{"A", "B", "V", "b"}`` → :class:`~jaxdyn.models.Control`.

    Raises:
        ValueError: controls of the wrong shape.
    """
    from ..models import Control

    if not isinstance(controls, Mapping) or not controls:
        raise ValueError("controls must be a non-empty mapping {name: (L, ...) array}")
    n_layers = _n_layers(controls)
    d = int(np.shape(controls.get("Q", controls.get("V", controls.get("A"))))[-1])
    dtype = jnp.result_type(*[jnp.asarray(v) for v in controls.values()])
    c = _full_controls("euclidean", controls, d, n_layers, dtype)
    B = jnp.einsum("lji,ljk->lik", c["K"], c["Q"])  # K_lᵀ Q_l
    return {"A": Control(c["A"], t1), "B": Control(B, t1), "V": Control(c["V"], t1),
            "b": Control(c["b"], t1)}
