"""Linear stability of the uniform state on S¹ (docs/math.md §C.2) and its measurement.

``linear_rates`` and ``most_unstable_mode`` are the closed forms, evaluated on the host with
SciPy's Bessel functions I_k of any order (JAX has orders 0 and 1 only); ``growth_rate`` is the
solver's own rate, a JVP of the right-hand side: traceable in the model's parameters.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_integer
from ..models._params import check_domain
from ._circle import BETA, SIGMA, CircleDensity, cos_mode, mode_amplitude, uniform_density

__all__ = ["linear_rates", "most_unstable_mode", "growth_rate"]


def linear_rates(beta, ks, sigma=0.0, normalization="softmax"):
    """λ_k = (k²/β) I_k(β)/I_0(β) − σ²k²/2 (softmax), (k²/β) I_k(β) − σ²k²/2 (unnormalised).

    The growth rates of the Fourier modes of the uniform state (B = V = I), on the host.

    Args:
      beta: inverse temperature β > 0 (concrete).
      ks: the modes k (array-like).
      sigma: noise σ ≥ 0.
      normalization: ``"softmax"`` or ``"unnormalized"``.

    Returns:
      NumPy float64 rates, the shape of ``ks``.

    Raises:
      ValueError: β not a finite number > 0, σ not a finite number ≥ 0, modes that are not
        finite, or an unknown normalization.
    """
    from scipy.special import ive

    if normalization not in ("softmax", "unnormalized"):
        raise ValueError(f"normalization must be 'softmax' or 'unnormalized', got {normalization!r}")
    check_domain("beta", beta, BETA)
    check_domain("sigma", sigma, SIGMA)
    ks = np.asarray(ks, float)
    if not np.all(np.isfinite(ks)):
        raise ValueError(f"ks (the modes) must be finite, got {ks}")
    if normalization == "softmax":
        ratio = ive(ks, beta) / ive(0, beta)
        if not np.all(np.isfinite(ratio)) and np.all(ks == np.round(ks)) and np.all(ks >= 0):
            ratio = _bessel_ratios(float(beta), ks)  # past SciPy's range (β ≳ 2·10⁹)
        core = ks ** 2 / beta * ratio
    else:
        core = ks ** 2 / beta * ive(ks, beta) * np.exp(beta)
    return core - sigma ** 2 * ks ** 2 / 2


def _bessel_ratios(beta: float, ks) -> np.ndarray:
    """I_k(β)/I_0(β) for integer k ≥ 0 at any β > 0 (NumPy, on the host).

    The product of the ratios ρ_j = I_j/I_{j−1} = β/(2j + β ρ_{j+1}), the continued fraction
    run backwards from ρ_{L+1} = 0 with L = 2 max(k) + 30 + 10√β (ρ_j stays near 1 up to j ~ √β,
    so the start must lie well past it): SciPy's ``ive`` returns NaN for β past the 32-bit range
    of its arguments.

    Returns:
        float64 array of the shape of ``ks``.
    """
    ks = np.asarray(ks).astype(np.int64)
    top = int(ks.max(initial=0))
    log_rho = np.zeros(top + 1)
    rho = 0.0
    for j in range(2 * top + 30 + int(10 * np.sqrt(beta)), 0, -1):
        rho = beta / (2 * j + beta * rho)
        if j <= top:
            log_rho[j] = np.log(rho)
    return np.exp(np.cumsum(log_rho))[ks]


def most_unstable_mode(beta, k_max=None, sigma=0.0):
    """The most unstable mode k* = argmax_k λ_k (softmax), on the host.

    argmax k² I_k(β)/I_0(β) without noise (the cluster count that first appears), argmax
    (k²/β) I_k/I_0 − σ²k²/2 with noise σ.

    Args:
      beta: inverse temperature β > 0 (concrete).
      k_max: the largest mode searched (default 10 + 4√(2β)).
      sigma: noise σ ≥ 0.

    Returns:
      k* as a Python int.

    A ValueError (from the shared checks) refuses a β that is not a finite number > 0, a σ
    that is not a finite number ≥ 0, and a ``k_max`` that is not an integer ≥ 1.
    """
    check_domain("beta", beta, BETA)
    check_domain("sigma", sigma, SIGMA)
    if k_max is not None:
        k_max = check_integer("k_max", k_max, minimum=1)
    else:
        k_max = int(10 + 4 * np.sqrt(2 * float(beta)))
    ks = np.arange(1, k_max + 1)
    return int(ks[np.argmax(linear_rates(beta, ks, sigma=sigma))])


def growth_rate(model: CircleDensity, k):
    """The solver's growth rate of the k-th mode of the uniform state (traceable in the model).

    The Jacobian of the discrete right-hand side at ρ = 1/(2π) applied to the cell averages of
    cos kθ (a forward-mode JVP, so exactly linear: no ε), projected on mode k. Because the face
    velocities are the exact band-limited ones and the finite-volume update is exact for cell
    averages, this equals λ_k (:func:`linear_rates`) up to rounding.

    Args:
      model: a :class:`CircleDensity` (its β, σ, weights may be traced).
      k: a mode (int), or a list of modes, in [1, M/2] (static).

    Returns:
      A scalar array, or one rate per mode.

    Raises:
      ValueError: a mode outside [1, M/2].
    """
    ks = np.atleast_1d(k)
    if np.any(ks < 1) or np.any(ks > model.m // 2):
        raise ValueError(f"k must lie in [1, M/2] = [1, {model.m // 2}] for M = {model.m} "
                         f"cells, got {k}")
    cs = jnp.stack([cos_mode(model.m, int(j), model.beta.dtype) for j in ks])
    rates = _rates(model, cs, jnp.asarray(ks))
    return rates if np.ndim(k) else rates[0]


@eqx.filter_jit
def _rates(model, cs, ks):
    """The JVP at the uniform state on each mode, projected on it."""
    u = uniform_density(model.m, model.beta.dtype)
    jv = jax.vmap(lambda c: jax.jvp(lambda r: model(0.0, r), (u,), (c,))[1])(cs)
    amp = jnp.fft.rfft(jv, axis=-1)
    amp0 = jnp.fft.rfft(cs, axis=-1)
    idx = jnp.arange(cs.shape[0])
    return jnp.real(amp[idx, ks] / amp0[idx, ks])
