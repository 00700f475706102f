"""The particle field on S¹ in O(N K) by the Fourier (Bessel) series of the attention kernel.

For x_i, x_j on the circle, x_j = e(φ_j), and B = QᵀK any 2×2 matrix, β⟨Bᵀx_i, x_j⟩ = r_i cos(φ_j − α_i)
with r_i = β|Bᵀx_i| and α_i the angle of Bᵀx_i, so (Jacobi–Anger)

    e^{β x_iᵀB x_j} = Σ_{k∈ℤ} I_k(r_i) e^{ik(φ_j − α_i)}.

Truncated at |k| ≤ K, both softmax sums become

    D_i = Σ_j e^{…} = Σ_{|k|≤K} I_k(r_i) e^{−ikα_i} S_k,   Σ_j e^{…} e^{iφ_j} = Σ_{|k|≤K} I_k(r_i) e^{−ikα_i} S_{k+1},

with the power sums S_k = Σ_j e^{ikφ_j} (S_{−k} = conj S_k) computed once: O(N K) a field instead of
O(N²). The Bessel functions are scaled, I_k(r) e^{−r}, and computed from i0e(r) and the ratios
I_k/I_{k−1} by the backward continued fraction (bounded by 1, no overflow).

**Truncation bound (certified).** From the power series, I_k(r) ≤ (r/2)^k/k! · e^{r²/(4(k+1))}; for
k > K the ratio of consecutive bounds is ≤ q = r/(2(K+2)), so for q < 1

    2 Σ_{k>K} I_k(r) ≤ T(K, r) = 2 (r/2)^{K+1}/(K+1)! · e^{r²/(4(K+2))} / (1 − q),

increasing in r. Since e^{β x_iᵀB x_j} ≥ e^{−r_i}, the truncation changes D_i and the numerator by at
most N·T(K, r_i) ≤ D_i · T(K, r_max) e^{r_max}, r_max = β‖B‖₂. K is the smallest integer with
T(K, r_max) e^{r_max} ≤ tol (default: the dtype's unit roundoff), so the softmax mean m_i changes
by at most 2·tol/(1 − tol): below rounding. What remains is rounding in the sums, relative
≈ ε·N/D_i (terms of size up to N against D_i ≥ N e^{−2r_i}): about ε for spread clouds, and up to
ε e^{2r} when a query sees the whole cloud near its antipode (large β only).

Off the circle (the stages of projected RK4) the keys and values are taken at x_j/|x_j| and the
query at x_i itself: another smooth extension of the same tangent field, so the integrators keep
their order; ``tests/test_pde.py`` compares trajectories with the dense field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_bounds, check_integer, nan_where, scalar_domain
from ..models import AbstractQKVModel, Domain
from ..models._params import check_domain
from ._circle import check_weights, host_value, to_leaf

__all__ = ["CircleAttention", "fourier_modes", "bessel_ive"]

#: the most Fourier modes ``CircleAttention`` chooses by itself (β‖QᵀK‖₂ up to about 1800 at
#: the float32 roundoff); a larger ``n_modes`` must be passed explicitly
MAX_MODES = 4096


def _log_tail_bound(K: int, r: float) -> float:
    """The logarithm of T(K, r) (module docstring); +inf where the geometric step q ≥ 1."""
    if r == 0:
        return -math.inf
    q = r / (2 * (K + 2))
    if q >= 1:
        return math.inf
    return (math.log(2) + (K + 1) * math.log(r / 2) - math.lgamma(K + 2) + r * r / (4 * (K + 2))
            - math.log1p(-q))


def fourier_modes(r_max: float, tol: float) -> int:
    """The smallest K with T(K, r_max) e^{r_max} ≤ tol (on the host: concrete inputs).

    Truncating the kernel's Fourier series at |k| ≤ K changes every softmax sum by at most
    ``tol`` relative (module docstring).

    Args:
      r_max: β‖B‖₂ ≥ 0, the largest |β Bᵀx|.
      tol: the relative truncation error, in (0, 1).

    Returns:
      K, a Python int.

    Raises:
      ValueError: r_max negative or not finite, tol outside (0, 1).
    """
    r_max, tol = float(r_max), float(tol)
    if not (r_max >= 0 and math.isfinite(r_max)):
        raise ValueError(f"r_max = β‖QᵀK‖₂ must be finite and >= 0, got {r_max}")
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    K = 0
    while _log_tail_bound(K, r_max) + r_max > math.log(tol):
        K += 1
    return K


def bessel_ive(r, K: int, extra: int | None = None):
    """I_k(r) e^{−r} for k = 0..K (last axis), r ≥ 0 an array (traceable).

    i0e(r) times the products of the ratios ρ_k = I_k/I_{k−1} = r/(2k + r ρ_{k+1}) (backward,
    from ρ_{L+1} = 0, L = 2K + 30).

    Args:
      r: array of arguments ≥ 0 (any shape).
      K: the largest order (static).
      extra: start the backward recurrence at L = K + extra (default 2K + 30).

    Returns:
      r.shape + (K + 1,) array.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses K or extra not an integer
    >= 0, or a concrete r that is not finite and >= 0. A traced value outside the domain gives
    NaN (in its entry's row).
    """
    K = check_integer("K (the largest order)", K, minimum=0)
    extra = None if extra is None else check_integer("extra", extra, minimum=0)
    check_bounds("r", r, low=0)
    bad = scalar_domain("r", r, low=0)[1]
    r = jnp.asarray(r) if bad is None else jnp.where(bad, 0, r)
    L = 2 * K + 30 if extra is None else K + int(extra)

    def step(rho_next, k):
        rho_k = r / (2 * k + r * rho_next)
        return rho_k, rho_k

    ks = jnp.arange(L, 0, -1, dtype=r.dtype)
    _, ratios = jax.lax.scan(step, jnp.zeros_like(r), ks)  # ρ_L, ..., ρ_1
    ratios = jnp.flip(ratios, 0)[:K]                         # ρ_1 .. ρ_K
    ratios = jnp.moveaxis(ratios, 0, -1)
    i0 = jax.scipy.special.i0e(r)[..., None]
    return nan_where(bad, jnp.concatenate([i0, i0 * jnp.cumprod(ratios, axis=-1)], -1))


class CircleAttention(AbstractQKVModel):
    r"""Softmax (or unnormalised) self-attention of N particles on S¹ in O(N K) a field.

    Equal to :class:`jaxdyn.SphereAttention` with d = 2 up to rounding on the circle (module
    docstring): ẋ_i = P⊥(x_i) V m_i, m_i = Σ_j e^{β x_iᵀBx_j} x_j / Σ_j e^{β x_iᵀBx_j}. Building
    it runs no device computation (concrete inputs are checked on the host, NumPy weights inside
    ``jax.jit`` included).

    Args:
      Q: (2, 2) query weights (any; B = QᵀK need not be a rotation).
      K: (2, 2) key weights.
      V: (2, 2) value weights.
      beta: inverse temperature β > 0 (concrete, unless ``n_modes`` is given).
      normalization: ``"softmax"`` or ``"unnormalized"`` (weights e^{β x_iᵀBx_j}/N).
      n_modes: the truncation K (static: the length of the series); default
        :func:`fourier_modes`(β‖B‖₂, tol), which needs concrete β, Q, K, and is refused above
        ``MAX_MODES`` (pass n_modes then).
      tol: relative truncation error of the sums (default: the dtype's unit roundoff).
      dtype: the floating dtype of the leaves (default: Q's, else JAX's default float).

    Attributes:
      Q, K, V, beta: the array leaves.
      normalization, n_modes: static settings.

    Raises:
      ValueError: a weight not 2 × 2, a concrete Q or K not finite, β not a scalar, a concrete β not
        finite and > 0, an unknown normalization, n_modes not an integer ≥ 0, n_modes not
        given with traced β, Q or K, or not given when the truncation needs more than
        ``MAX_MODES`` modes (the message names the n_modes to pass).
    """

    domains: ClassVar[Mapping[str, Domain]] = {"beta": Domain("positive", 0, "inverse temperature")}
    beta: jax.Array
    normalization: str = eqx.field(static=True, default="softmax")
    n_modes: int = eqx.field(static=True, default=0)

    def __init__(self, Q, K, V, beta, *, normalization="softmax", n_modes=None, tol=None, dtype=None):
        Q, K, V, dtype, (hq, hk, _) = check_weights(Q, K, V, 2, dtype, "(CircleAttention: particles on S¹)")
        self.Q, self.K, self.V = Q, K, V
        check_domain("beta", beta, CircleAttention.domains["beta"])
        hb = host_value(beta, dtype)
        self.beta = to_leaf(beta, hb, dtype)
        if normalization not in ("softmax", "unnormalized"):
            raise ValueError(f"normalization must be 'softmax' or 'unnormalized', got {normalization!r}")
        self.normalization = normalization
        if n_modes is None:
            if hb is None or hq is None or hk is None:
                raise ValueError("CircleAttention: n_modes is chosen from concrete β, Q, K; pass "
                                 "n_modes when building it from traced values under jit/vmap/grad")
            tol = float(jnp.finfo(dtype).eps) / 2 if tol is None else tol
            r_max = float(hb) * float(np.linalg.norm(hq.T @ hk, 2))
            n_modes = fourier_modes(r_max, tol)
            if n_modes > MAX_MODES:
                raise ValueError(
                    f"CircleAttention: β‖QᵀK‖₂ = {r_max:.4g} needs n_modes = {n_modes} Fourier "
                    f"modes for the truncation error {tol:.3g}, above MAX_MODES = {MAX_MODES} "
                    f"(each field costs O(N·n_modes) sequential steps; from n_modes ~ N the "
                    f"dense field is cheaper). Pass n_modes={n_modes} to accept that cost (or "
                    f"a smaller n_modes, or a larger tol, for a coarser field), or use "
                    f"jaxdyn.SphereAttention on d = 2 (dense, O(N²))")
        self.n_modes = check_integer("n_modes", n_modes, minimum=0, integral_floats=True)

    def sums(self, x):
        """(D, Nc, r) at the queries x (N, 2) against the keys x̂_j = x_j/|x_j|, scaled by e^{−r_i}.

        With r_i = β|Bᵀx_i|: D_i = Σ_j e^{β x_iᵀB x̂_j − r_i}, Nc_i the same sum of x̂_j,1 + i x̂_j,2.
        One forward pass for the power sums S_k = Σ_j z_j^k (z_j = e^{iφ_j}, k = 0..K+1), one
        backward pass for the ratios ρ_k = I_k/I_{k−1} (from L = 2K + 30 down to K+1), then
        Horner from k = K down to 1 with P_k = ρ_1⋯ρ_k (I_k e^{−r} = i0e(r) P_k), ū = e^{−iα_i}:
        D = i0e·Re[S_0 + 2H_1], H_k = ρ_k ū (S_k + H_{k+1}); Nc = i0e·(S_1 + G_1 + E_1),
        G_k = ρ_k ū (S_{k+1} + G_{k+1}), E_k = ρ_k u (conj S_{k−1} + E_{k+1}).

        Args:
          x: (N, 2) points (on the circle, or near it: RK stages).

        Returns:
          (D (N,), Nc (N,) complex, r (N,)).
        """
        K = self.n_modes
        cdt = jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64
        nx = jnp.sqrt(jnp.sum(x * x, -1))
        z = ((x[:, 0] + 1j * x[:, 1]) / jnp.where(nx > 0, nx, 1)).astype(cdt)

        def power_sum(zk, _):
            return zk * z, jnp.sum(zk)

        _, S = jax.lax.scan(power_sum, jnp.ones_like(z), None, length=K + 2)   # S_0..S_{K+1}
        w = jnp.matmul(x, self.B, precision="highest")  # rows (Bᵀx_i)ᵀ
        nw = jnp.sqrt(jnp.sum(w * w, -1))
        r = self.beta * nw
        ub = jnp.where(nw > 0, (w[:, 0] - 1j * w[:, 1]) / jnp.where(nw > 0, nw, 1), 1).astype(cdt)
        u = jnp.conj(ub)
        L = 2 * K + 30

        def ratio(rho_next, k):
            return r / (2 * k + r * rho_next), None

        rho, _ = jax.lax.scan(ratio, jnp.zeros_like(r), jnp.arange(L, K, -1, dtype=r.dtype))

        def horner(carry, k):
            rho_next, H, G, E = carry
            rho_k = r / (2 * k + r * rho_next)
            ki = k.astype(jnp.int32)
            H = rho_k * ub * (S[ki] + H)
            G = rho_k * ub * (S[ki + 1] + G)
            E = rho_k * u * (jnp.conj(S[ki - 1]) + E)
            return (rho_k, H, G, E), None

        zero = jnp.zeros_like(z)
        (_, H, G, E), _ = jax.lax.scan(horner, (rho, zero, zero, zero),
                                       jnp.arange(K, 0, -1, dtype=r.dtype))
        i0 = jax.scipy.special.i0e(r)
        D = i0 * jnp.real(S[0] + 2 * H)
        Nc = i0 * (S[1] + G + E)
        return D, Nc, r

    def ambient(self, t, x, args=None):
        """The field before the tangent projection: V m_i (softmax mean, or the unnormalised sum).

        Args:
          t: time (unused).
          x: (N, 2) points.
          args: unused (diffrax's signature).

        Returns:
          (N, 2) array.
        """
        D, Nc, r = self.sums(x)
        if self.normalization == "softmax":
            m = Nc / jnp.maximum(D, jnp.finfo(x.dtype).tiny)
        else:
            m = Nc * jnp.exp(r) / x.shape[0]
        m = jnp.stack([jnp.real(m), jnp.imag(m)], -1).astype(x.dtype)
        return jnp.matmul(m, self.V.T, precision="highest")
