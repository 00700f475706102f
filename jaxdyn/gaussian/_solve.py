r"""Gaussian moment dynamics of Paper B: the moment ODE, its adaptive solve, blow-up.

For tokens ``ẋ = A x + b + V Σ_j w_ij x_j`` with ``w_ij ∝ exp(x_jᵀ B x_i)`` a Gaussian
``N(m, Σ)`` stays Gaussian (docs/math.md §B.2, exponential tilting gives the attention mean
``m + Σ B x``), with

    m' = (A + V) m + V Σ B m + b
    Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ  =  M Σ + Σ Mᵀ,   M = A + V Σ B.

The right side is computed as ``G + Gᵀ`` with ``G = M Σ``, so a symmetric state stays
*exactly* symmetric (every Runge–Kutta combination acts identically on the (i, j) and
(j, i) entries). ``Σ(t) = Φ Σ0 Φᵀ`` with ``Φ' = M Φ``, so the rank of Σ is invariant; a
Runge–Kutta solve of Σ keeps it up to the integration tolerance (the null-space
eigenvalues stay at the level ``rtol · ‖Σ‖``).

Controls: each of ``A, B, V, b`` is either a constant array or a :class:`Control`
(piecewise-constant or piecewise-linear on a uniform grid over ``[0, t1]``); both are array
leaves, so the solve is ``jit``/``vmap``/``grad`` friendly (``diffrax.RecursiveCheckpointAdjoint``
by default).

Blow-up: the covariance can reach infinity in finite time (e.g. ``V = v I``, ``A = 0``,
``v(B + Bᵀ) ≻ 0``). ``s = ‖Σ‖_F`` obeys ``s' = ℓ s + q s²`` with
``ℓ = ⟨Σ̂, AΣ̂ + Σ̂Aᵀ⟩`` and ``q = ⟨Σ̂, VΣ̂BΣ̂ + Σ̂BᵀΣ̂Vᵀ⟩`` (``Σ̂ = Σ/s``). A solve stops
when ``s ≥ blowup_threshold · max(‖Σ0‖_F, 1)`` (a diffrax event). It is a *blow-up* when
``s`` is on a pole there: the quadratic part dominates (``q s ≥ 100 |ℓ|``) and is of the
size a pole has (``q ≥ 10⁻³ ‖VΣ̂‖_F ‖BΣ̂‖_F``, q's own scale in the direction Σ̂: q is
at most twice that; along a stiff slow manifold, met in random
sweeps, ``s`` grows at an O(1) rate, so ``q ~ rate/s`` is 10⁻⁵ of that at ``s ~ 10⁶`` even
though ``q s ≫ |ℓ|``). The blow-up time is then refined by the scalar Bernoulli law with
the coefficients frozen at the detection point,
``T* = t + log(1 + ℓ/(q s)) / ℓ`` (``= t + 1/(q s)`` when ``ℓ = 0``), whose error is of
order ``(T* − t)²``, i.e. ``1/s²``. Otherwise the status is ``large`` and no T* is claimed.

Status: ``MomentSolution.result`` is a :class:`jaxdyn.RESULTS` code (``successful``,
``blowup``, ``large``, ``nonfinite``, ``max_steps_reached``, ``invalid_input``, or another
of diffrax's codes), one per member under ``vmap``; ``jaxdyn.status_code(name)`` gives
the int code of a name for comparisons with ``sol.status``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Optional, Union

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..models._control import Control
from ..models._params import Domain, invalid_parameters
from .._checks import (check_bounds, check_dtype, check_integer, check_times, settings_problem,
                       with_settings)
from .._results import RESULTS, Solution, stat, error_if_failed, from_codes, status_code, status_codes

HIGHEST = jax.lax.Precision.HIGHEST

__all__ = [
    "Control",
    "MomentField",
    "VariantMomentField",
    "MomentSolution",
    "MomentOptions",
    "solve_moments",
    "covariance_curves",
    "check_covariance",
    "DOMINANCE",
    "POLE_FRACTION",
    "pole_refine",
]

#: a large ‖Σ‖ is called a blow-up only where the quadratic part of ``s' = ℓ s + q s²``
#: dominates: ``q s ≥ DOMINANCE · |ℓ|`` (docs/math.md §B.7)
DOMINANCE = 100.0
#: ...and where q has a pole's size: ``q ≥ POLE_FRACTION · ‖VΣ̂‖_F ‖BΣ̂‖_F``
POLE_FRACTION = 1e-3


# ---------------------------------------------------------------------------------------
# Controls
# ---------------------------------------------------------------------------------------


def _at(p, t):
    return p(t) if isinstance(p, Control) else p


def _shape_of(p):
    return p.shape if isinstance(p, Control) else jnp.shape(p)


# ---------------------------------------------------------------------------------------
# The vector field
# ---------------------------------------------------------------------------------------


def _mm(x, y):
    """``x @ y`` (matrix @ matrix or matrix @ vector) of the small moment matrices.

    A multiply-add over the inner index: XLA fuses it with its neighbours, where a ``dot``
    (batched under ``vmap``, with transposes around it) is a kernel of its own, and compile
    time grows with the number of kernels.

    Args:
        x: (..., d, d).
        y: (..., d, d) or (d,).

    Returns:
        The product.
    """
    if jnp.ndim(y) == 1:
        return jnp.sum(x * y, axis=-1)
    return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def moment_rhs(m, S, A, B, V, b):
    r"""Right side of the moment ODE for one member at fixed parameters (docs/math.md §B.2).

        m' = (A + V) m + V Σ B m + b,   Σ' = G + Gᵀ,   G = (A + V Σ B) Σ.

    Args:
        m: (d,) mean.
        S: (d, d) covariance.
        A: (d, d).
        B: (d, d).
        V: (d, d).
        b: (d,).

    Returns:
        ``(m', Σ')``; Σ' exactly symmetric.
    """
    SB = _mm(S, B)
    G = _mm(A + _mm(V, SB), S)
    dm = _mm(A + V, m) + _mm(V, _mm(SB, m)) + b
    return dm, G + G.T


class MomentField(eqx.Module):
    r"""The Gaussian moment vector field ``field(t, (m, Σ), args) -> (m', Σ')`` (docs/math.md §B.2).

        m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ.

    State ``y = (m, Σ)`` with shapes ((d,), (d, d)). Usable as ``diffrax.ODETerm(field)``.
    Concrete parameters are checked on the host (NumPy); traced ones are not.

    Args:
        A: (d, d) array or :class:`Control`.
        B: (d, d) array or Control.
        V: (d, d) array or Control.
        b: (d,) array, Control or None (= 0).

    Attributes:
        A: the parameter (an array or a Control).
        B: the parameter.
        V: the parameter.
        b: the parameter.

    Raises:
        ValueError: a shape that does not fit, or a concrete parameter with NaN or inf.
    """

    domains: ClassVar[Mapping[str, Domain]] = {}  # the parameters' own: the Controls' t1
    A: Union[jax.Array, Control]
    B: Union[jax.Array, Control]
    V: Union[jax.Array, Control]
    b: Union[jax.Array, Control]

    def __init__(self, A, B, V, b=None):
        def conv(name, p, want):
            vals = p.values if isinstance(p, Control) else p
            # concrete values are checked on the host, in NumPy, before any conversion
            if _is_concrete(vals):
                v = np.asarray(vals)
                if np.issubdtype(v.dtype, np.inexact) and not np.all(np.isfinite(v)):
                    raise ValueError(f"{name} must be finite (it holds NaN or inf)")
            if not isinstance(p, Control):
                p = jnp.asarray(p)
            shape = p.shape
            if want is not None and tuple(shape) != tuple(want):
                raise ValueError(f"{name} must have shape {want} (or be a Control with values of "
                                 f"shape (n, *{want})), got {tuple(shape)}")
            return p, shape

        A, sA = conv("A", A, None)
        if len(sA) != 2 or sA[0] != sA[1]:
            raise ValueError(f"A must be a square (d, d) matrix or Control, got shape {tuple(sA)}")
        d = sA[0]
        B, _ = conv("B", B, (d, d))
        V, _ = conv("V", V, (d, d))
        if b is None:
            dt = A.dtype if not isinstance(A, Control) else A.values.dtype
            b = jnp.zeros((d,), dt)
        b, _ = conv("b", b, (d,))
        self.A, self.B, self.V, self.b = A, B, V, b

    @property
    def dim(self) -> int:
        """The dimension d."""
        return _shape_of(self.A)[0]

    def invalid(self):
        """Whether a Control parameter's traced ``t1`` lies outside its domain.

        Returns:
            A boolean (NumPy when every Control's t1 is concrete, a JAX array otherwise).
        """
        return invalid_parameters(self)

    def params(self, t):
        """``(A, B, V, b)`` at time t."""
        return _at(self.A, t), _at(self.B, t), _at(self.V, t), _at(self.b, t)

    def breakpoints(self):
        """Concatenated jump/kink times of all Control parameters (None when all constant)."""
        return _breakpoints(self.A, self.B, self.V, self.b)

    def __call__(self, t, y, args=None):
        """``(m', Σ')`` at time t and state ``y = (m, Σ)`` (``args`` unused)."""
        m, S = y
        return moment_rhs(m, S, *self.params(t))


def _breakpoints(*params):
    """Concatenated jump/kink times of the Control parameters (None when all constant)."""
    bps = [p.breakpoints() for p in params if isinstance(p, Control)]
    bps = [x for x in bps if x.shape[0] > 0]
    return jnp.concatenate(bps) if bps else None


class VariantMomentField(eqx.Module):
    r"""The moment field of multi-head softmax, L2 or Sinkhorn attention (docs/math.md §G.5).

    For ``ẋ = A x + b + Σ_h V_h E_{w^h}[y | x]`` the conditional means on N(m, Σ) are affine,
    ``c_h + T_h(Σ) x`` (:func:`jaxdyn.gaussian.variant_moment_rhs`), so

        m' = A m + b + Σ_h V_h (c_h + T_h m),   Σ' = M Σ + Σ Mᵀ,   M = A + Σ_h V_h T_h(Σ).

    Args:
        A: (d, d) array, :class:`Control` or None (= 0).
        Q: (H, p, d) (or (p, d)) per-head query weights.
        K: (H, p, d) (or (p, d)) per-head key weights.
        V: (H, d, d) (or (d, d)) per-head value weights.
        b: (d,) array, Control or None (= 0).
        beta: inverse temperature β > 0.
        attention: ``"softmax"`` | ``"l2"`` | ``"sinkhorn"`` (entropic ε = 1/β, the
            converged plan).

    Attributes:
        A: the drift matrix (an array or a Control).
        b: the drift offset.
        Q: (H, p, d).
        K: (H, p, d).
        V: (H, d, d).
        beta: scalar array.
        attention: the kind (static).

    Raises:
        ValueError: an unknown attention, shapes that do not fit, or a concrete β ≤ 0 or
            not a scalar.
    """

    A: Union[jax.Array, Control]
    b: Union[jax.Array, Control]
    Q: jax.Array
    K: jax.Array
    V: jax.Array
    beta: jax.Array
    attention: str = eqx.field(static=True, default="softmax")

    def __init__(self, A, Q, K, V, b=None, *, beta=1.0, attention="softmax"):
        from ._variants import COVARIANCE_ATTENTIONS, _heads

        if attention not in COVARIANCE_ATTENTIONS:
            raise ValueError(f"attention must be one of {COVARIANCE_ATTENTIONS}, got "
                             f"{attention!r}")
        Q, K, V = _heads(Q, K, V)
        d = Q.shape[2]
        if A is None:
            A = jnp.zeros((d, d), Q.dtype)
        sA = _shape_of(A) if isinstance(A, Control) else jnp.shape(A)
        if tuple(sA) != (d, d):
            raise ValueError(f"A must have shape ({d}, {d}) to match Q, K, V, got {tuple(sA)}")
        if b is None:
            b = jnp.zeros((d,), Q.dtype)
        if tuple(_shape_of(b)) != (d,):
            raise ValueError(f"b must have shape ({d},), got {tuple(_shape_of(b))}")
        self.A = A if isinstance(A, Control) else jnp.asarray(A)
        self.b = b if isinstance(b, Control) else jnp.asarray(b)
        self.Q, self.K, self.V = Q, K, V
        self.beta = jnp.asarray(beta, Q.dtype)
        if self.beta.ndim != 0:
            raise ValueError(f"beta must be a scalar, got shape {self.beta.shape}")
        if _is_concrete(self.beta) and not bool(self.beta > 0):
            raise ValueError(f"beta (inverse temperature) must be > 0, got {float(self.beta)}")
        self.attention = attention

    @property
    def dim(self) -> int:
        """The dimension d."""
        return self.Q.shape[2]

    def breakpoints(self):
        """Concatenated jump/kink times of the Control parameters (None when all constant)."""
        return _breakpoints(self.A, self.b)

    def __call__(self, t, y, args=None):
        """``(m', Σ')`` at time t and state ``y = (m, Σ)`` (``args`` unused)."""
        from ._variants import variant_moment_rhs

        m, S = y
        return variant_moment_rhs(m, S, _at(self.A, t), _at(self.b, t), self.Q, self.K, self.V,
                                  self.beta, attention=self.attention)


# ---------------------------------------------------------------------------------------
# Blow-up indicators (shared with the batched solver)
# ---------------------------------------------------------------------------------------


def blowup_indicators(S, A, B, V):
    r"""The blow-up indicators ``(s, ℓ, q)`` at one state: ``s = ‖Σ‖_F``, ``s' = ℓ s + q s²``.

    ``ℓ = ⟨Σ̂, AΣ̂ + Σ̂Aᵀ⟩`` and ``q = ⟨Σ̂, VΣ̂BΣ̂ + Σ̂BᵀΣ̂Vᵀ⟩`` with ``Σ̂ = Σ/s`` (module doc).

    Args:
        S: (d, d) covariance at the current time (of any size: only Σ̂ enters ℓ and q).
        A: (d, d) the parameters there (the model's A, B, V at that time).
        B: (d, d) likewise.
        V: (d, d) likewise.

    Returns:
        ``(s, ℓ, q)``.
    """
    s = jnp.sqrt(jnp.sum(S * S))
    safe = jnp.where(s > 0, s, 1.0)
    Sh = S / safe
    L = _mm(A, Sh)
    ell = 2.0 * jnp.sum(Sh * L)
    Q = _mm(_mm(V, _mm(Sh, B)), Sh)
    q = 2.0 * jnp.sum(Sh * Q)
    return s, ell, q


def remaining_time(s, ell, q):
    r"""The frozen-coefficient Bernoulli estimate of ``T* − t``, ``log(1 + ℓ/(q s)) / ℓ``.

    (``1/(q s)`` when ℓ = 0.)

    Args:
        s: ``‖Σ‖_F``.
        ell: the linear rate ℓ.
        q: the quadratic rate q.

    Returns:
        The remaining time.
    """
    qs = q * s
    x = ell / jnp.where(qs != 0, qs, 1.0)
    xs = jnp.where(jnp.abs(x) > 1e-8, x, 1.0)
    ratio = jnp.where(jnp.abs(x) > 1e-8, jnp.log1p(jnp.maximum(xs, -1 + 1e-16)) / xs, 1.0 - x / 2)
    return ratio / jnp.where(qs != 0, qs, 1.0)


class _PoleField(eqx.Module):
    r"""The projective blow-up system in the time τ (:func:`pole_refine`), ``z = (t, Ŝ, w)``."""

    A: jax.Array
    B: jax.Array
    V: jax.Array

    def rates(self, z):
        """``(L(Ŝ), Q(Ŝ), g)`` at ``z``."""
        _, Sh, w = z
        L = _mm(self.A, Sh)
        L = L + L.T
        G = _mm(_mm(self.V, _mm(Sh, self.B)), Sh)
        Q = G + G.T
        g = jnp.sum(Sh * (jnp.exp(w) * L + Q)) / jnp.sum(Sh * Sh)
        return L, Q, g

    def done(self, z):
        """Converged: the remaining time ``u/g`` is below ``8 eps max(|t|, 1)``."""
        t_, _, w = z
        _, _, g = self.rates(z)
        eps = jnp.finfo(w.dtype).eps
        return (g > 0) & (jnp.exp(w) <= 8 * eps * jnp.maximum(jnp.abs(t_), 1.0) * g)

    def __call__(self, tau, z, args):
        """``dz/dτ``."""
        _, Sh, _ = z
        L, Q, g = self.rates(z)
        u = jnp.exp(z[2])
        return (u, u * L + Q - g * Sh, -g)


def pole_refine(t, S, A, B, V, *, rtol: float, atol: float, max_steps: int = 400, active=True):
    r"""Refine a blow-up time from a state ``(t, Σ)`` near the pole: ``T* = lim_{τ→∞} t(τ)``.

    Beyond the detection point Σ has sub-leading singular parts (powers ``(T* − t)^{−γ}``,
    ``0 < γ < 1``, from the O(1) directions amplified along ``V u``), so the local
    extrapolation converges slowly in the threshold (``T*`` from ``‖Σ‖ = 10⁶`` and ``10¹⁰``
    can differ in the fifth digit). Instead, integrate the projective
    system in the reparametrised time ``dt/dτ = u = 1/‖Σ‖`` with ``Σ = Ŝ/u``, ``w = log u``:

        t' = e^w,   Ŝ' = e^w L(Ŝ) + Q(Ŝ) − g Ŝ,   w' = −g,   g = ⟨Ŝ, e^w L(Ŝ) + Q(Ŝ)⟩ / ⟨Ŝ, Ŝ⟩,

    (``L(Ŝ) = AŜ + ŜAᵀ``, ``Q(Ŝ) = VŜBŜ + ŜBᵀŜVᵀ``; the gauge g keeps ‖Ŝ‖ = 1; ``log u``
    rather than u keeps ``t' > 0`` when steps grow). It is bounded and tends to the fixed
    point ``u = 0``, ``Ŝ`` rank one, so adaptive steps in τ grow and ``t → T*``
    exponentially. One ``diffrax.diffeqsolve`` (Dopri8, PID steps in τ from
    ``0.05/g``) stopped by a ``diffrax.Event`` once the remaining time ``u/g`` is below
    ``8 eps max(t, 1)``; then ``T* = t + log(1 + ℓ/(q s))/ℓ`` at that point (the
    frozen-coefficient Bernoulli remainder, of the size of the stopping tolerance).
    Not converged within ``max_steps`` means the flow left the pole (it turned onto the
    cone ``uᵀBu = 0``, where g → 0 and ‖Σ‖ saturates). g may dip, even below 0, and
    recover on a genuine pole whose direction is still turning, so a dip alone is not a
    verdict.

    Args:
        t: detection time.
        S: (d, d) covariance at t (large: ``‖Σ‖`` at the blow-up threshold).
        A: (d, d) parameter at t.
        B: (d, d) parameter at t.
        V: (d, d) parameter at t.
        rtol: relative tolerance of the steps in τ.
        atol: absolute tolerance of the steps in τ.
        max_steps: step budget of the solve in τ.
        active: False skips the solve (members without a blow-up under ``vmap``; the
            returned T* is then meaningless).

    Returns:
        ``(T*, converged)``, scalars of S's dtype and bool.
    """
    z, conv, _ = pole_steps(pole_start(t, S), A, B, V, rtol=rtol, atol=atol,
                            max_steps=max_steps, active=active)
    return pole_time(z, A, B, V), conv


def pole_start(t, S):
    """The start ``z = (t, Ŝ, w)`` of :func:`pole_steps` at ``(t, Σ)``: ``Ŝ = Σ/‖Σ‖``, ``w = −log ‖Σ‖``."""
    s = jnp.sqrt(jnp.sum(S * S, axis=(-2, -1)))
    s = jnp.where(s > 0, s, 1.0)
    return (jnp.asarray(t, S.dtype), S / s[..., None, None], -jnp.log(s))


def pole_steps(z0, A, B, V, *, rtol: float, atol: float, max_steps: int, active=True, dt0=None):
    """At most ``max_steps`` steps in τ of the system of :func:`pole_refine` from ``z0``.

    One ``diffrax.diffeqsolve`` (Dopri8, PID steps in τ) stopped by a ``diffrax.Event`` once
    converged; a solve that is not converged can be continued from the state and with the
    step returned.

    Args:
        z0: ``(t, Ŝ, w)`` (:func:`pole_start`).
        A: (d, d).
        B: (d, d).
        V: (d, d).
        rtol: relative tolerance in τ.
        atol: absolute tolerance in τ.
        max_steps: step budget.
        active: False stops at once.
        dt0: the first step in τ (None: ``0.05/g`` at z0).

    Returns:
        ``(z, converged, step)``: the state reached, whether it converged, and the last
        accepted step in τ (to continue with).
    """
    field = _PoleField(A, B, V)
    dtype = z0[1].dtype
    active = jnp.asarray(active, bool)
    if dt0 is None:
        _, _, g0 = field.rates(z0)
        dt0 = 0.05 / jnp.where(g0 > 0, g0, 1.0)
    dt0 = jnp.asarray(dt0, dtype)
    # an inactive member (or one already converged) stops at once: the event holds at τ = 0
    stop = lambda tau, z, args, **kw: field.done(z) | ~active  # noqa: E731
    tau = lambda tau, z, args: tau  # noqa: E731
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field), diffrax.Dopri8(), jnp.zeros((), dtype), jnp.asarray(_TAU_END, dtype),
        dt0, z0, saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(t1=True),
                                             diffrax.SubSaveAt(steps=True, fn=tau)]),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        event=diffrax.Event(stop), max_steps=max_steps, throw=False, adjoint=diffrax.ForwardMode())
    z = jax.tree.map(lambda x: x[0], sol.ys[0])
    # the last accepted step: the last two step ends saved (unused entries are inf)
    taus = jnp.concatenate([jnp.zeros((1,), dtype), jnp.where(jnp.isfinite(sol.ys[1]), sol.ys[1], -1.0)])
    k = jnp.argmax(taus)
    step = jnp.where(k > 0, taus[k] - taus[jnp.maximum(k - 1, 0)], dt0)
    return z, field.done(z), step


def pole_time(z, A, B, V):
    """``T* = t + log(1 + ℓ/(q s))/ℓ`` at a state ``z = (t, Ŝ, w)`` of :func:`pole_steps`.

    Args:
        z: ``(t, Ŝ, w)``.
        A: (d, d).
        B: (d, d).
        V: (d, d).

    Returns:
        T*.
    """
    t_, Sh, w = z
    L, Q, _ = _PoleField(A, B, V).rates(z)
    nS2 = jnp.sum(Sh * Sh)
    ell = jnp.sum(Sh * L) / nS2
    q = jnp.sum(Sh * Q) / nS2 / jnp.sqrt(nS2)
    return t_ + remaining_time(jnp.sqrt(nS2) * jnp.exp(-w), ell, q)


# The end of the τ interval of pole_refine: never reached (the event or the step budget ends
# the solve first); finite, as diffrax's controller wants.
_TAU_END = 1e30


def on_pole(s, ell, q, vb):
    """The pole signature: ``q s ≥ 100 |ℓ|``, ``q > 0`` and ``q ≥ 10⁻³ vb``.

    Args:
        s: ``‖Σ‖_F``.
        ell: the linear rate ℓ of ``s' = ℓ s + q s²``.
        q: the quadratic rate q.
        vb: ``‖VΣ̂‖_F ‖BΣ̂‖_F`` (:func:`pole_scale`; q ≤ 2 vb).

    Returns:
        Bool: ``s`` is on a pole.
    """
    return (q * s >= DOMINANCE * jnp.abs(ell)) & (q > 0) & (q >= POLE_FRACTION * vb)


def pole_scale(S, V, B):
    """The pole test's scale ``‖V Σ̂‖_F ‖B Σ̂‖_F`` (``Σ̂ = Σ/‖Σ‖_F``) over the last two axes.

    The scale of ``q = 2 tr(Σ̂ V Σ̂ B Σ̂)`` in the direction Σ̂: q is at most twice it, and
    it is at most ``‖V‖_F ‖B‖_F``. Invariant under V → cV, B → B/c and under scalings of V
    and B on directions Σ̂ does not see (``‖V‖_F ‖B‖_F`` is not: with V = diag(1, 10⁴),
    B = diag(1, −10⁻⁴) the exact pole at T* = 0.5 would fail a test on that scale). On the
    cone ``uᵀBu = 0`` (the stiff slow manifold, Σ̂ → uuᵀ) q → 0 while ``‖Vu‖ ‖Bu‖`` stays of
    the size of V and B, so that growth is told apart from a pole.

    Args:
        S: (..., d, d) covariances.
        V: (..., d, d).
        B: (..., d, d).

    Returns:
        (...) the scale.
    """
    # Σ̂ first: with Σ itself the product grows like ‖Σ‖⁴ and overflowed float32 at the
    # detection point (a pole called large)
    s = jnp.sqrt(jnp.sum(S * S, axis=(-2, -1)))[..., None, None]
    Sh = S / jnp.where(s > 0, s, 1.0)
    VS = jnp.matmul(V, Sh, precision=jax.lax.Precision.HIGHEST)
    BS = jnp.matmul(B, Sh, precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.sum(VS * VS, axis=(-2, -1))) * jnp.sqrt(jnp.sum(BS * BS, axis=(-2, -1)))


# ---------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------


def _is_concrete(x) -> bool:
    """Whether ``x`` is not a tracer (its value is known on the host)."""
    return not isinstance(x, jax.core.Tracer)


# Error tolerances a dtype can honour: an rtol below ``RTOL_FLOOR_EPS · eps(dtype)`` (and
# an atol below ``ATOL_FLOOR_EPS · eps``) asks for steps whose error is lost in the
# rounding of the state itself; the PID controller then shrinks steps until max_steps
# (tests/test_gaussian_float32.py: in float32, rtol = 1e-8 ends max_steps_reached at
# t = 0.768, where rtol = 1e-6 finds the blow-up in 82 steps).
RTOL_FLOOR_EPS = 10.0
ATOL_FLOOR_EPS = 0.1


def dtype_tolerances(dtype, rtol, atol):
    """``(rtol, atol)`` raised to what ``dtype`` can resolve: ``rtol ≥ 10 eps``, ``atol ≥ 0.1 eps``.

    Args:
        dtype: the solve's floating dtype.
        rtol: the relative tolerance asked for.
        atol: the absolute tolerance asked for.

    Returns:
        ``(rtol, atol)`` as Python floats (float32: at least 1.19e-6 and 1.19e-8; float64
        leaves any rtol ≥ 2.2e-15).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses an rtol or atol that is
    not a finite number >= 0.
    """
    check_bounds("rtol", rtol, low=0)
    check_bounds("atol", atol, low=0)
    eps = float(jnp.finfo(dtype).eps)
    return max(float(rtol), RTOL_FLOOR_EPS * eps), max(float(atol), ATOL_FLOOR_EPS * eps)


# The blow-up threshold a dtype can reach: near a pole ``T* − t ≈ 1/(q ‖Σ‖)``, and adaptive
# steps of a fraction of that stall (``t + h == t``) once it nears ``eps · t``. In float32 a
# threshold of 10⁶ sits at that edge (the detection then fails erratically, ``max_steps``),
# so the threshold is capped at ``BLOWUP_RESOLVE / eps`` (float32: 8389; float64: 4.5e12,
# above any usual threshold). ``pole_refine`` continues past the detection point, so T*
# keeps its accuracy.
BLOWUP_RESOLVE = 1e-3


def dtype_threshold(dtype, threshold):
    """The blow-up threshold ``dtype`` can resolve, ``min(threshold, 1e-3 / eps(dtype))``.

    Args:
        dtype: the solve's floating dtype.
        threshold: the threshold asked for.

    Returns:
        A Python float (float32: at most 8389).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses a threshold that is not a
    finite number > 1 (a solve would stop at once).
    """
    check_bounds("blowup_threshold", threshold, low=1, low_open=True)
    return min(float(threshold), BLOWUP_RESOLVE / float(jnp.finfo(dtype).eps))


def _cov_tol(dtype, d):
    """The covariance check's tolerance ``100 d eps`` (relative to ``max(1, max|S|)``)."""
    return 100.0 * d * float(jnp.finfo(dtype).eps)


def covariance_defects(S):
    """``(asymmetry, min_eigenvalue, scale)`` of a candidate covariance (traceable).

    Args:
        S: (d, d).

    Returns:
        ``max |S − Sᵀ|``, the smallest eigenvalue of ``(S + Sᵀ)/2`` and ``max(1, max|S|)``.
    """
    scale = jnp.maximum(jnp.max(jnp.abs(S)), 1.0)
    asym = jnp.max(jnp.abs(S - S.T))
    lmin = jnp.linalg.eigvalsh(0.5 * (S + S.T))[0]
    return asym, lmin, scale


def check_covariance(S, name: str = "S0"):
    """Check that ``S`` is a symmetric PSD (d, d) covariance and return it symmetrised.

    Tolerances are relative, ``100 d eps(dtype) max(1, max|S|)``. Rank-deficient S is valid.
    Under tracing (``jit``/``vmap``/``grad``) the value checks are skipped here (the shape
    and dtype are still checked); :func:`solve_moments` then reports
    ``RESULTS.invalid_input``.

    Dtypes: float32 or float64; an integer S is refused (a ValueError: the solve's dtype is
    S0's), float16, bfloat16 and complex too (a TypeError naming it).

    Args:
        S: the candidate covariance.
        name: its name in the error message.

    Returns:
        ``(S + Sᵀ)/2``.

    Raises:
        ValueError: S is not square with d >= 1, not floating, not finite, not symmetric or
            not PSD (the message gives the asymmetry or the smallest eigenvalue).
    """
    S = jnp.asarray(S)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 1:
        raise ValueError(f"{name} must be a square (d, d) covariance matrix with d >= 1, got "
                         f"shape {S.shape}")
    if not jnp.issubdtype(S.dtype, jnp.inexact):
        raise ValueError(f"{name} must have a floating dtype, got {S.dtype}")
    check_dtype(name, S, integers=False)
    if _is_concrete(S):
        # On the host (numpy): the same defects without compiling one small program per op.
        Sn = np.asarray(S)
        with np.errstate(invalid="ignore"):
            scale = max(float(np.max(np.abs(Sn))), 1.0) if Sn.size else 1.0
            asym = float(np.max(np.abs(Sn - Sn.T))) if Sn.size else 0.0
            lmin = (float(np.linalg.eigvalsh(0.5 * (Sn + Sn.T))[0])
                    if Sn.size and np.all(np.isfinite(Sn)) else (np.nan if Sn.size else 0.0))
        tol = _cov_tol(S.dtype, S.shape[0]) * scale
        if not np.isfinite(asym) or not np.isfinite(lmin):
            raise ValueError(f"{name} must be finite")
        if asym > tol:
            raise ValueError(f"{name} must be symmetric: max |{name} - {name}ᵀ| = {asym:.3e} "
                             f"(tolerance {tol:.1e})")
        if lmin < -tol:
            raise ValueError(f"{name} must be positive semi-definite: min eigenvalue = {lmin:.3e} "
                             f"(tolerance -{tol:.1e})")
        return jnp.asarray(0.5 * (Sn + Sn.T))
    return 0.5 * (S + S.T)


# ---------------------------------------------------------------------------------------
# The adaptive (diffrax) solve
# ---------------------------------------------------------------------------------------


class MomentSolution(Solution):
    r"""Result of :func:`solve_moments` (a :class:`jaxdyn.Solution`; every leaf an array).

    The moments at the save times (a trajectory, as diffrax's ``ys``) and the state where
    the solve ended. Under ``vmap`` every leaf gains the leading member axis.

    Attributes:
        ts: (n_save,) save times.
        mean: (n_save, d) the mean at ``ts``; NaN at save times at or after a blow-up or a
            failure.
        cov: (n_save, d, d) the covariance at ``ts``; NaN there likewise.
        t_final: the time reached (t1 when successful, the detection time after a blow-up).
        mean_final: (d,) the mean at ``t_final``.
        cov_final: (d, d) the covariance at ``t_final``.
        blowup_time: the refined ``T*`` (inf unless the status is ``blowup``).
        result: :class:`jaxdyn.RESULTS` (``.status`` its int codes, compare with
            ``jaxdyn.status_code(name)``; ``.messages``, ``.ok``).
        stats: ``{"num_steps"`` (attempted: accepted + rejected), ``"num_accepted_steps"}``.
    """

    result: RESULTS
    stats: dict
    ts: jax.Array
    mean: jax.Array
    cov: jax.Array
    t_final: jax.Array
    mean_final: jax.Array
    cov_final: jax.Array
    blowup_time: jax.Array

    # the step counts of every driver, read from ``stats``
    num_steps, num_accepted_steps = (stat(k, doc) for k, doc in (
        ("num_steps", "Steps attempted, accepted and rejected: ``stats['num_steps']``."),
        ("num_accepted_steps", "Steps accepted: ``stats['num_accepted_steps']``.")))


def _save_times(saveat, t1, dtype):
    if saveat is None:
        return jnp.reshape(jnp.asarray(t1, dtype), (1,))
    if isinstance(saveat, (int, np.integer)) and not isinstance(saveat, bool):
        if saveat < 1:
            raise ValueError(f"saveat as a count must be >= 1, got {saveat}")
        if saveat == 1:  # one time: the end (linspace would give t = 0, the input itself)
            return jnp.reshape(jnp.asarray(t1, dtype), (1,))
        return jnp.linspace(0.0, 1.0, int(saveat), dtype=dtype) * jnp.asarray(t1, dtype)
    ts = jnp.asarray(saveat, dtype)
    if ts.ndim != 1:
        raise ValueError(f"saveat must be None, an int or a 1-D array of times, got shape {ts.shape}")
    return ts


def _prepared_start(S0, threshold):
    """``(S0 symmetrised, S0 not a covariance to its dtype's tolerance, the event threshold)``.

    Args:
        S0: (d, d) initial covariance.
        threshold: the blow-up threshold relative to ``max(‖S0‖_F, 1)``.

    Returns:
        The triple (the threshold on ``‖Σ‖_F``, absolute).
    """
    asym, lmin, scale = covariance_defects(S0)
    tol = _cov_tol(S0.dtype, S0.shape[0]) * scale
    invalid = ~((asym <= tol) & (lmin >= -tol))
    S0 = 0.5 * (S0 + S0.T)
    return S0, invalid, threshold * jnp.maximum(jnp.sqrt(jnp.sum(S0 * S0)), 1.0)


def _solve_until(field, solver, y0, t0, t1, ts, dt0, rtol, atol, cond_fn, max_steps, adjoint,
                 controller=None):
    """One adaptive diffrax solve of ``field`` from ``y0 = (m0, S0)`` on [t0, t1].

    Saved at ``ts`` (within [t0, t1]) and at its end, stopped by the event ``cond_fn``.

    Args:
        field: the moment field.
        solver: a diffrax solver.
        y0: ``(m0, S0)``.
        t0: start time.
        t1: end time.
        ts: (n_save,) save times.
        dt0: first step (None: diffrax's choice).
        rtol: relative tolerance (of the default controller).
        atol: absolute tolerance (of the default controller).
        cond_fn: the event's condition.
        max_steps: step budget.
        adjoint: diffrax adjoint.
        controller: a diffrax step-size controller, given as is (None: a PID controller at
            ``rtol, atol`` with the field's breakpoints as jump times).

    Returns:
        ``(solution, (means, covariances) at ts, (mean, covariance, time) at the end)``.
    """
    if controller is None:
        controller = diffrax.PIDController(rtol=rtol, atol=atol, jump_ts=field.breakpoints())
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field), solver, t0, t1, dt0, y0,
        saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)]),
        stepsize_controller=controller, event=diffrax.Event(cond_fn), max_steps=max_steps,
        throw=False, adjoint=adjoint)
    (m_all, S_all), (m_end, S_end) = sol.ys
    return sol, (m_all, S_all), (m_end[0], S_end[0], sol.ts[1][0])


def _threshold_event(thr):
    """The blow-up event's condition: ``‖Σ‖_F ≥ thr`` or a non-finite state.

    A boolean ``diffrax.Event`` condition: the solve ends at the end of the step that
    passed it.

    Args:
        thr: the threshold on ``‖Σ‖_F``.

    Returns:
        ``cond_fn(t, y, args, **kwargs) -> bool``.
    """
    def cond_fn(t, y, args, **kwargs):
        m, S = y
        bad = ~(jnp.all(jnp.isfinite(S)) & jnp.all(jnp.isfinite(m)))
        return (jnp.sum(S * S) >= thr * thr) | bad

    return cond_fn


def _traced_times(t1, ts):
    """The checks of the host's check_times, for traced times.

    Returns:
        ``(bad, t1, ts)``: whether they fail, and the times to solve on (stand-ins where
        they fail: diffrax's own checks stay quiet, the step count bounded).
    """
    bad = ~(jnp.isfinite(t1) & (t1 > 0) & jnp.all(jnp.isfinite(ts)) & jnp.all(ts >= 0)
            & jnp.all(ts <= t1) & jnp.all(ts[1:] >= ts[:-1]))
    return bad, jnp.where(bad, jnp.ones_like(t1), t1), jnp.where(bad, jnp.ones_like(ts), ts)


def _stiff_continuation(field, first, ts, t1, rtol, atol, cond_fn, stiff_steps, adjoint):
    """The members whose explicit budget ran out, continued by Rodas5 (PID steps).

    The others start at t1 and take no step.

    Args:
        field: the moment field.
        first: ``(sol, (m_all, S_all), (m_end, S_end, t_end), result, nsteps, nacc)`` of the
            explicit solve.
        ts: the save times.
        t1: the final time.
        rtol: relative tolerance.
        atol: absolute tolerance.
        cond_fn: the blow-up event.
        stiff_steps: Rodas5's step budget.
        adjoint: diffrax adjoint.

    Returns:
        ``((m_all, S_all), (m_end, S_end, t_end), result, nsteps, nacc, handed)`` merged.
    """
    from ..integrators.rodas5 import Rodas5

    (m_all, S_all), (m_end, S_end, t_end), result, nsteps, nacc = first
    handed = result == status_code("max_steps_reached")
    t_start = jnp.where(handed, t_end, t1)
    sol2, (m_all2, S_all2), (m_end2, S_end2, t_end2) = _solve_until(
        field, Rodas5(), (m_end, S_end), t_start, t1, jnp.clip(ts, t_start, t1), None, rtol,
        atol, cond_fn, stiff_steps, adjoint)
    later = handed & (ts > t_end)
    m_all = jnp.where(later[:, None], m_all2, m_all)
    S_all = jnp.where(later[:, None, None], S_all2, S_all)
    m_end, S_end = jnp.where(handed, m_end2, m_end), jnp.where(handed, S_end2, S_end)
    t_end = jnp.where(handed, t_end2, t_end)
    result = jnp.where(handed, status_codes(sol2.result), result)
    nsteps = nsteps + jnp.where(handed, sol2.stats["num_steps"], 0)
    nacc = nacc + jnp.where(handed, sol2.stats["num_accepted_steps"], 0)
    return (m_all, S_all), (m_end, S_end, t_end), result, nsteps, nacc


def _pole_status(field, status, big, S_end, t_end, t1, rtol, atol, pole_steps):
    """The pole test and T* of a member past the threshold (``blowup``), else ``status``.

    T* is refined past the detection point (projective system in τ, :func:`pole_refine`); a
    pole that does not converge there, or is refined past t1 (the solution is finite on
    [0, t1]: it only passed the threshold before t1), stays ``large``. T* is not
    differentiated: stop_gradient keeps the refinement out of JVP/VJP traces.

    Returns:
        ``(status, T*)``.
    """
    dtype, d = S_end.dtype, S_end.shape[0]
    A, B, V, _ = field.params(t_end)
    s, ell, q = blowup_indicators(S_end, A, B, V)
    blew = big & on_pole(s, ell, q, pole_scale(S_end, V, B))
    sg = jax.lax.stop_gradient
    S_safe = jnp.where(blew, S_end, jnp.eye(d, dtype=dtype))
    T_ref, conv = pole_refine(sg(jnp.where(blew, t_end, 0.0)), sg(S_safe), sg(A), sg(B), sg(V),
                              rtol=rtol, atol=atol, max_steps=pole_steps, active=blew)
    blew = blew & conv & (T_ref <= t1)
    status = jnp.where(blew, status_code("blowup"), status)
    return status, jnp.where(blew, T_ref, jnp.full((), jnp.inf, dtype)).astype(dtype)


def _member_solve(field, m0, S0, t1, ts, rtol, atol, threshold, solver, max_steps, adjoint, dt0,
                  *, stiff_steps: int = 0, stiff_status=None, pole: bool = True,
                  pole_steps: int = 400, controller=None):
    """One member's solve and status (jit/vmap/grad friendly; the core of both drivers).

    ``solver`` from (m0, S0) on [0, t1] with the blow-up event (arguments as
    :func:`solve_moments`'s, ``threshold`` relative to ``max(‖S0‖_F, 1)``).

    Args:
        field: :class:`MomentField` or :class:`VariantMomentField`.
        m0: (d,) initial mean.
        S0: (d, d) initial covariance.
        t1: final time.
        ts: (n_save,) save times.
        rtol: relative tolerance.
        atol: absolute tolerance.
        threshold: the blow-up threshold.
        solver: a diffrax solver.
        max_steps: the solver's step budget.
        adjoint: diffrax adjoint.
        dt0: first step or None.
        stiff_steps: if > 0, a member whose budget ``max_steps`` ran out continues from
            there with :class:`jaxdyn.integrators.rodas5.Rodas5` for at most this many steps
            (the stiff stage of :func:`jaxdyn.gaussian.solve_moments_batch`; PID steps at
            ``rtol, atol`` whatever ``controller``).
        stiff_status: with ``stiff_steps = 0``, the code of a budget that runs out
            (default ``max_steps_reached``).
        pole: the pole test and T* refinement (:func:`pole_refine`) of a member past the
            threshold; else it is ``large``.
        pole_steps: the refinement's step budget.
        controller: the step-size controller of ``solver`` (None: PID at ``rtol, atol``).

    Returns:
        ``(MomentSolution, whether the member went to the stiff stage)``.
    """
    dtype = S0.dtype
    S0, invalid, thr = _prepared_start(S0, threshold)
    if callable(getattr(field, "invalid", None)):  # a traced control grid out of its domain
        invalid = invalid | field.invalid()
    bad_times, t1, ts = _traced_times(t1, ts)
    invalid = invalid | bad_times
    cond_fn = _threshold_event(thr)
    zero = jnp.zeros((), dtype)
    sol, saved, end = _solve_until(field, solver, (m0, S0), zero, t1, ts, dt0, rtol, atol,
                                   cond_fn, max_steps, adjoint, controller)
    result = status_codes(sol.result)
    nsteps, nacc = sol.stats["num_steps"], sol.stats["num_accepted_steps"]
    maxed_code = status_code("max_steps_reached")
    handed = result == maxed_code
    if stiff_steps:
        saved, end, result, nsteps, nacc = _stiff_continuation(
            field, (saved, end, result, nsteps, nacc), ts, t1, rtol, atol, cond_fn, stiff_steps,
            adjoint)
    elif stiff_status is not None:
        maxed_code = stiff_status
    (m_all, S_all), (m_end, S_end, t_end) = saved, end
    s = jnp.sqrt(jnp.sum(S_end * S_end))
    finite = jnp.all(jnp.isfinite(S_end)) & jnp.all(jnp.isfinite(m_end)) & jnp.isfinite(t_end)
    event = result == status_code("event_occurred")
    big = event & finite & (s >= thr)
    ok = (result == status_code("successful")) & finite
    maxed = result == status_code("max_steps_reached")
    # diffrax's other codes (dt_min_reached, ...) pass through; a non-finite end is nonfinite
    other = jnp.where(finite & ~event, result, status_code("nonfinite"))
    status = jnp.where(big, status_code("large"),
                       jnp.where(maxed & finite, maxed_code, other))
    status = jnp.where(ok, status_code("successful"), status)
    tstar = jnp.full((), jnp.inf, dtype)
    if pole:
        status, tstar = _pole_status(field, status, big, S_end, t_end, t1, rtol, atol, pole_steps)
    status = jnp.where(invalid, status_code("invalid_input"), status).astype(jnp.int32)
    # Saved values at or after the end of a terminated solve are undefined: NaN, not diffrax's inf.
    good = (ts < t_end) | (status == status_code("successful"))
    nan = jnp.asarray(jnp.nan, dtype)
    out = MomentSolution(ts=ts, mean=jnp.where(good[:, None], m_all, nan),
                         cov=jnp.where(good[:, None, None], S_all, nan),
                         t_final=t_end.astype(dtype), mean_final=m_end, cov_final=S_end,
                         blowup_time=tstar, result=from_codes(status),
                         stats={"num_steps": nsteps, "num_accepted_steps": nacc})
    return out, handed


@eqx.filter_jit
def _solve_jit(field, m0, S0, t1, ts, rtol, atol, threshold, solver, max_steps, adjoint, dt0,
               throw=False, controller=None):
    """:func:`_member_solve` of Paper B's field, jitted; ``throw`` raises on a failed result."""
    out, _ = _member_solve(field, m0, S0, t1, ts, rtol, atol, threshold, solver, max_steps,
                           adjoint, dt0, controller=controller)
    return error_if_failed(out, out.result) if throw else out


@eqx.filter_jit
def _solve_variant_jit(field, m0, S0, t1, ts, rtol, atol, threshold, solver, max_steps, adjoint,
                       dt0, throw=False, controller=None):
    """:func:`_solve_jit` for a :class:`VariantMomentField` (``large`` past the threshold).

    No pole test and no T*: the multi-head and L2/Sinkhorn right-hand sides have no single
    (V, B) quadratic part.

    Returns:
        The :class:`MomentSolution`.
    """
    out, _ = _member_solve(field, m0, S0, t1, ts, rtol, atol, threshold, solver, max_steps,
                           adjoint, dt0, pole=False, controller=controller)
    return error_if_failed(out, out.result) if throw else out


def _field_of(field=None, *, A=None, B=None, V=None, b=None, attention=None, Q=None, K=None,
                 beta=None, caller: str = "solve_moments"):
    """The moment field of a call: ``field`` itself, or the one its keywords describe.

    Args:
        field: a :class:`MomentField` or :class:`VariantMomentField`, or None.
        A: (d, d) array or :class:`Control` (None with ``attention``: 0).
        B: (d, d) array or Control (Paper B's field).
        V: (d, d) array or Control; with ``attention``, (H, d, d) (or (d, d)).
        b: (d,) array, Control or None (= 0).
        attention: None (:class:`MomentField`) or a :class:`VariantMomentField` kind.
        Q: with ``attention``: per-head query weights.
        K: with ``attention``: per-head key weights.
        beta: with ``attention``: inverse temperature (None: 1).
        caller: the function named in the errors.

    Returns:
        The field.

    Raises:
        TypeError: a ``field`` that is not a moment field, or a field and a keyword for one
            of its parameters both given (the keyword named).
        ValueError: keywords that do not describe a field (missing A/B, or Q/K with
            ``attention``).
    """
    given = {k: v for k, v in dict(A=A, B=B, V=V, b=b, attention=attention, Q=Q, K=K,
                                   beta=beta).items() if v is not None}
    if field is not None:
        if not isinstance(field, (MomentField, VariantMomentField)):
            raise TypeError(f"{caller}: field must be a MomentField or a VariantMomentField, got "
                            f"{type(field).__name__}")
        if given:
            raise TypeError(f"{caller}: the parameters are given twice: field= and the "
                            f"keyword(s) {sorted(given)}; give the field or the keywords")
        return field
    if V is None:
        raise ValueError(f"{caller}: V is required (or field=MomentField(A, B, V, b))")
    if attention is None:
        if A is None or B is None or Q is not None or K is not None or beta is not None:
            raise ValueError(f"{caller}: A and B are required (and Q, K, beta not taken) "
                             "unless attention= selects a variant right-hand side")
        return MomentField(A, B, V, b)
    if B is not None or Q is None or K is None:
        raise ValueError(f"{caller}(attention={attention!r}) takes Q, K (per-head "
                         f"weights) and beta instead of B")
    return VariantMomentField(A, Q, K, V, b, beta=1.0 if beta is None else beta,
                              attention=attention)


@dataclasses.dataclass(frozen=True)
class MomentOptions:
    """Settings of :func:`solve_moments`: ``solve_moments(m0, S0, field=f, t1=1.0, options=...)``.

    Each field can also be passed to :func:`solve_moments` as a keyword, which replaces that
    field of the options given. ``solver``, ``stepsize_controller`` and ``adjoint`` go to
    ``diffrax.diffeqsolve`` as given. Concrete values are checked when the options are made (a
    ``ValueError`` or ``TypeError`` naming the field).

    Attributes:
        rtol: relative tolerance of the default PID controller (a Python float: changing it
            recompiles), raised to what the dtype resolves, ``rtol ≥ 10 eps``
            (:func:`dtype_tolerances`; float32: 1.19e-6). Also the tolerance of the T*
            refinement.
        atol: absolute tolerance, ``atol ≥ 0.1 eps`` (float32: 1.19e-8).
        solver: a diffrax solver (default ``diffrax.Dopri8()``, 8th order; for stiff
            problems :class:`jaxdyn.integrators.rodas5.Rodas5`).
        stepsize_controller: a diffrax step-size controller, given as is (default
            ``diffrax.PIDController(rtol, atol, jump_ts=the Controls' breakpoints)``; a
            ``diffrax.ConstantStepSize()`` needs ``dt0``; a controller of your own does not get
            the breakpoints: pass ``jump_ts=field.breakpoints()`` to it for Controls).
        max_steps: step budget (``max_steps_reached`` when it runs out).
        blowup_threshold: the solve stops once ``‖Σ‖_F ≥ blowup_threshold · max(‖Σ0‖_F, 1)``:
            status ``blowup`` with a refined ``T*`` on a pole, ``large`` otherwise (module
            doc). Capped at what the dtype resolves, ``1e-3 / eps`` (float32: 8389;
            :func:`dtype_threshold`).
        adjoint: diffrax adjoint (default ``diffrax.RecursiveCheckpointAdjoint()``), given
            as is.
        dt0: first step (None: diffrax's choice).
        throw: if True, a result other than ``successful`` (a blow-up included) raises with
            its message (``eqx.error_if``: also under jit/vmap). Default False.
    """

    rtol: float = 1e-8
    atol: float = 1e-10
    solver: Optional[diffrax.AbstractSolver] = None
    stepsize_controller: Optional[diffrax.AbstractStepSizeController] = None
    max_steps: int = 16384
    blowup_threshold: float = 1e6
    adjoint: Optional[diffrax.AbstractAdjoint] = None
    dt0: Optional[float] = None
    throw: bool = False

    def __post_init__(self):
        check_solver_objects("MomentOptions", solver=self.solver,
                             stepsize_controller=self.stepsize_controller, adjoint=self.adjoint)
        check_integer("max_steps", self.max_steps, minimum=1)
        check_bounds("rtol", self.rtol, low=0)
        check_bounds("atol", self.atol, low=0)
        check_bounds("blowup_threshold", self.blowup_threshold, low=1, low_open=True)


def check_solver_objects(owner: str, **objects):
    """Refuse a ``solver``, ``stepsize_controller`` or ``adjoint`` that is not diffrax's kind.

    Args:
        owner: the options class named in the message.
        **objects: the objects by name (None: not given, accepted).

    Raises:
        TypeError: naming the field and the kind of object it takes.
    """
    kinds = {"solver": (diffrax.AbstractSolver, "diffrax solver (diffrax.Dopri8(), ...)"),
             "stepsize_controller": (diffrax.AbstractStepSizeController,
                                     "diffrax step-size controller (diffrax.PIDController, "
                                     "diffrax.ConstantStepSize, ...)"),
             "adjoint": (diffrax.AbstractAdjoint,
                         "diffrax adjoint (diffrax.RecursiveCheckpointAdjoint(), ...)")}
    for name, value in objects.items():
        cls, what = kinds[name]
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{owner}: {name} must be a {what}, got {type(value).__name__}")


def solve_moments(m0, S0, *, field=None, A=None, B=None, V=None, b=None, t1, saveat=None,
                  options: Optional[MomentOptions] = None, attention: Optional[str] = None,
                  Q=None, K=None, beta=None, **settings) -> MomentSolution:
    r"""Solve the Gaussian moment ODE with diffrax (adaptive steps, blow-up event).

        m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ   (docs/math.md §B.2)

    The system is a ``field`` (:class:`MomentField` ``(A, B, V, b)``, or a
    :class:`VariantMomentField` for multi-head / L2 / Sinkhorn attention), or the same
    parameters as keywords (``A=, B=, V=, b=``, or ``attention=, Q=, K=, V=, beta=``); one
    or the other, not both. The solve's settings are a :class:`MomentOptions` (tolerances,
    step budget, blow-up threshold; ``solver``, ``stepsize_controller`` and ``adjoint`` go to
    ``diffrax.diffeqsolve`` as given), or its fields as keywords.

    Jit-compiled internally; runs under ``jax.jit``, ``jax.vmap`` (over stacks of parameters,
    m0, S0: ``jax.vmap(lambda A: solve_moments(..., A=A, ...))``) and ``jax.grad`` (with
    respect to the parameters, controls and initial state). A vmapped adaptive solve runs
    until its slowest member ends; for large sweeps with blow-ups use
    :func:`jaxdyn.solve_moments_batch`.

    Args:
        m0: (d,) initial mean (None = 0).
        S0: (d, d) symmetric PSD initial covariance (rank-deficient allowed; the rank is
            preserved). A concrete S0 that is not symmetric / PSD raises; a traced one is
            reported ``invalid_input``.
        field: a :class:`MomentField` or :class:`VariantMomentField` (instead of the
            parameters' keywords).
        A: (d, d) array or :class:`Control` (with ``attention``: None = 0 allowed).
        B: (d, d) array or Control (None with ``attention``).
        V: (d, d) array or Control; with ``attention``, (H, d, d) (or (d, d)). Required
            unless ``field`` is given.
        b: (d,) array, Control or None (= 0).
        t1: final time.
        saveat: None (final time only), an int n (n uniform times on [0, t1], both ends
            included; n = 1: t1 alone) or a 1-D array of times in [0, t1].
        options: a :class:`MomentOptions` (None: its defaults).
        attention: None (Paper B's system above; A and B required) or ``"softmax"`` |
            ``"l2"`` | ``"sinkhorn"``: the closed moment ODE of multi-head attention in R^d
            (:class:`VariantMomentField`, docs/math.md §G.5),
            ``ẋ = A x + b + Σ_h V_h E_{w^h}[y | x]`` with logits β⟨Q_h x, K_h y⟩ (softmax,
            and Sinkhorn's doubly stochastic plan at ε = 1/β) or −β|Q_h x − K_h y|² (L2).
            Passing the threshold is then reported ``large`` (no pole test, no T*).
        Q: with ``attention``: (H, p, d) (or (p, d)) query weights.
        K: with ``attention``: (H, p, d) (or (p, d)) key weights.
        beta: with ``attention``: inverse temperature β > 0 (None: 1).
        **settings: any field of :class:`MomentOptions` by name (``rtol``, ``atol``,
            ``solver``, ``stepsize_controller``, ``max_steps``, ``blowup_threshold``,
            ``adjoint``, ``dt0``, ``throw``), replacing that field of ``options``.

    Dtypes: S0 float32 or float64 (the solve's dtype; an integer S0 is refused by name); m0
    float32, float64 or integers (converted to S0's dtype); float16, bfloat16 and complex
    are refused (a TypeError naming the parameter).

    Returns:
        A :class:`MomentSolution` (status in ``result``: :class:`jaxdyn.RESULTS`).

    Raises:
        ValueError: concrete inputs that do not fit: missing A/B/V (or Q/K with
            ``attention``), shapes, a non-finite m0, an S0 that is not a covariance,
            ``t1 <= 0``, bad save times, a ``max_steps`` that is not an integer >= 1, an
            rtol or atol that is not a finite number >= 0, a ``blowup_threshold`` not > 1.
        TypeError: a ``field`` together with a keyword of its parameters, a ``field`` or
            ``stepsize_controller`` of the wrong type, an unknown keyword (the nearest
            :class:`MomentOptions` field named), ``options`` that are not MomentOptions.
    """
    field = _field_of(field, A=A, B=B, V=V, b=b, attention=attention, Q=Q, K=K, beta=beta)
    problem = settings_problem(MomentOptions, options, settings, "solve_moments")
    if problem:
        raise TypeError(problem)
    o = with_settings(MomentOptions, options, settings)
    rtol, atol, solver, stepsize_controller = o.rtol, o.atol, o.solver, o.stepsize_controller
    blowup_threshold, adjoint, dt0, throw = o.blowup_threshold, o.adjoint, o.dt0, o.throw
    max_steps = int(o.max_steps)  # checked when the options were made
    d = field.dim
    S0 = jnp.asarray(S0)
    check_covariance(S0, "S0")
    check_dtype("m0", m0, fn="solve_moments")
    if S0.shape != (d, d):
        raise ValueError(f"S0 must have shape ({d}, {d}) to match A, got {S0.shape}")
    dtype = S0.dtype
    m0 = jnp.zeros((d,), dtype) if m0 is None else jnp.asarray(m0, dtype)
    if m0.shape != (d,):
        raise ValueError(f"m0 must have shape ({d},), got {m0.shape}")
    if _is_concrete(m0) and not np.all(np.isfinite(np.asarray(m0))):
        raise ValueError("m0 must be finite (it holds NaN or inf)")
    if _is_concrete(t1) and not float(t1) > 0:
        raise ValueError(f"t1 must be > 0, got {t1}")
    t1 = jnp.asarray(t1, dtype)
    ts = _save_times(saveat, t1, dtype)
    solver = diffrax.Dopri8() if solver is None else solver
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
    dt0 = None if dt0 is None else jnp.asarray(dt0, dtype)
    rtol, atol = dtype_tolerances(dtype, rtol, atol)
    blowup_threshold = dtype_threshold(dtype, blowup_threshold)
    run = _solve_jit if isinstance(field, MomentField) else _solve_variant_jit
    # concrete times are checked here, on the host (a clear ValueError before any tracing)
    concrete = _is_concrete(t1) and _is_concrete(ts) and (dt0 is None or _is_concrete(dt0))
    if concrete:
        check_times(0.0, t1, ts, dt0)
    return run(field, m0, S0, t1, ts, rtol, atol, blowup_threshold, solver, max_steps,
               adjoint, dt0, bool(throw), stepsize_controller)


def covariance_curves(m0, S0, *, A, B, V, b=None, t1, n_save: int = 200, **kw):
    """``tr Σ(t)`` on a uniform grid of ``n_save`` times on [0, t1], for plotting.

    Entries at or after a blow-up are NaN (matplotlib leaves a gap).

    Args:
        m0: (d,) initial mean or None.
        S0: (d, d) initial covariance.
        A: parameter (as :func:`solve_moments`).
        B: parameter.
        V: parameter.
        b: parameter or None.
        t1: final time.
        n_save: number of save times.
        **kw: further :func:`solve_moments` options.

    Returns:
        ``(ts, trace, cov, mean, solution)``; the solution last, for its ``blowup_time``
        and ``result``.
    """
    sol = solve_moments(m0, S0, A=A, B=B, V=V, b=b, t1=t1, saveat=n_save, **kw)
    trace = jnp.trace(sol.cov, axis1=-2, axis2=-1)
    return sol.ts, trace, sol.cov, sol.mean, sol
