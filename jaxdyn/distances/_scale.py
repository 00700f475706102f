"""Scale handling shared by the W2 functions: centring, power-of-two rescaling, dtypes.

W2 is translation-invariant and homogeneous, ``W2(s x + c, s y + c) = s W2(x, y)``, but its
squared cost overflows (or underflows) long before the points do: float32 points at 1e20 have
squared distances of 1e40. Every W2 function therefore solves on clouds brought to unit size,

    x̃ = (x / 2^a − c) / 2^b,    ỹ = (y / 2^a − c) / 2^b,

with ``2^a`` the power of two at the largest |entry| of both clouds, ``c`` the midpoint of
their means (a common shift: W2 is unchanged) and ``2^b`` the power of two at the largest
|entry| of the shifted clouds, and reports in the user's units with ``s = 2^(a+b)``: W2 times
s, squared quantities (W2², ε, bias bounds) times s². Powers of two make the divisions exact:
the only rounding is that of the shift's subtraction, relative to the centred points (so
clouds translated by 1e6 keep their digits), and the rescaled solve sees the same numbers
whatever the scale. The exponents carry no gradient (W2 of the rescaled clouds, times s, is
W2 of the clouds for any fixed s and c), so ``jax.grad`` through the rescaling is exact.

Half-precision clouds (float16, bfloat16) cannot hold a squared cost beyond 256 (float16
overflows at 65504), so they are computed in float32 with a ``UserWarning``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

#: the dtypes computed in float32 (with a warning) rather than in their own precision
HALF_DTYPES = (jnp.float16, jnp.bfloat16)

def is_half(dtype) -> bool:
    """Whether ``dtype`` is a half-precision float (float16 or bfloat16)."""
    return any(jnp.dtype(dtype) == jnp.dtype(h) for h in HALF_DTYPES)


def widen_half(arrays, fn: str):
    """``arrays`` (JAX arrays of one float dtype) cast to float32 if half precision, with a warning.

    Args:
        arrays: a sequence of JAX arrays.
        fn: the public function's name, for the warning.

    Returns:
        The arrays, float32 where they were float16 or bfloat16 (unchanged otherwise).
    """
    halves = sorted({str(a.dtype) for a in arrays if is_half(a.dtype)})
    if not halves:
        return list(arrays)
    warnings.warn(
        f"{fn}: {' and '.join(halves)} input is computed in float32 (half precision cannot hold "
        "the squared distances: float16 overflows beyond 65504, about 256²); the result is "
        "float32. Cast to float32 or float64 yourself to silence this warning", stacklevel=3)
    return [a.astype(jnp.float32) if is_half(a.dtype) else a for a in arrays]


def _limit(dtype) -> int:
    """The largest |k| with 2^k a normal number of ``dtype`` (float32 126, float64 1022)."""
    return 1022 if jnp.dtype(dtype) == jnp.float64 else 126


def _pow2(k, dtype):
    """2^k exactly, k an int32 array within ±:func:`_limit` (a normal number)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        bits = (k.astype(jnp.int64) + 1023) << 52
        return jax.lax.bitcast_convert_type(bits, jnp.float64)
    bits = (k.astype(jnp.int32) + 127) << 23
    return jax.lax.bitcast_convert_type(bits, jnp.float32).astype(dtype)


def times_pow2(v, k):
    """``v · 2^k`` (k an integer array broadcasting against v), without intermediate overflow.

    Applied in at most four steps of one sign (each factor a normal number), so an
    intermediate result overflows or underflows only where the final one does; each step is
    exact for normal results. Covers |k| up to 504 in float32 and 4088 in float64, beyond
    any exponent of a squared quantity of the dtype.

    Returns:
        An array of v's dtype.
    """
    v = jnp.asarray(v)
    k = jnp.asarray(k, jnp.int32)
    lim = _limit(v.dtype)
    out = v
    for _ in range(4):
        step = jnp.clip(k, -lim, lim)
        out = out * _pow2(step, v.dtype)
        k = k - step
    return out


def _exponent(a):
    """The int32 exponent ``e`` with ``a / 2^e`` in [1, 2) for finite a > 0; 0 elsewhere."""
    _, e = jnp.frexp(a)
    return jnp.where(jnp.isfinite(a) & (a > 0), e - 1, 0).astype(jnp.int32)


def _max_abs(a, axes):
    """The largest |entry| over ``axes`` (NaN if any entry is NaN)."""
    m = jnp.max(jnp.abs(a), axis=axes)
    return jnp.where(jnp.any(jnp.isnan(a), axis=axes), jnp.nan, m)


@jax.jit
def cloud_frame(x, y):
    """The unit-size clouds of the module doc, ``x̃ = (x / 2^a − c) / 2^b`` (likewise ỹ).

    Works traced (the shift and the exponents carry no gradient); the clouds are (N, d) and
    (M, d) of one float dtype. A cloud with a non-finite entry is passed through unscaled
    (exponent 0), so that the solve reports it.

    Returns:
        (x̃, ỹ, e, x_point, y_point): the rescaled clouds, the int32 exponent e (the scale
        is s = 2^e), and whether each cloud is a single point mass (all its points equal).
    """
    xs, ys = jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)
    big = jnp.maximum(_max_abs(xs, (0, 1)), _max_abs(ys, (0, 1)))
    finite = jnp.isfinite(big)
    a = _exponent(big)
    x1, y1 = times_pow2(x, -a), times_pow2(y, -a)
    x1s, y1s = jax.lax.stop_gradient(x1), jax.lax.stop_gradient(y1)
    c = 0.5 * (jnp.mean(x1s, axis=0) + jnp.mean(y1s, axis=0))
    c = jnp.where(finite, c, 0.0)
    x2, y2 = x1 - c, y1 - c
    spread = jnp.maximum(_max_abs(jax.lax.stop_gradient(x2), (0, 1)),
                         _max_abs(jax.lax.stop_gradient(y2), (0, 1)))
    b = jnp.where(finite, _exponent(spread), 0)
    xt, yt = times_pow2(x2, -b), times_pow2(y2, -b)
    e = jnp.where(finite, a + b, 0)
    xt = jnp.where(finite, xt, x)
    yt = jnp.where(finite, yt, y)
    x_point = jnp.all(xs == xs[:1])
    y_point = jnp.all(ys == ys[:1])
    return xt, yt, e.astype(jnp.int32), x_point, y_point


def point_mass_sq(xt, yt, x_point, y_point):
    """W2² of rescaled clouds one of which is a single point mass (closed form, no bias).

    Then the only coupling is the independent one: ``W2² = mean_ij |x_i − y_j|²``, which is
    ``mean_i |x_i − q|²`` for ``y = δ_q`` (``mean_j |y_j − p|²`` for ``x = δ_p``). The value is
    that direct form; the gradient that of ``var x + var y + |x̄ − ȳ|²`` (the same function at
    a point mass, smooth and symmetric elsewhere: NaN-free wherever it is evaluated).

    Returns:
        W2², a scalar array.
    """
    mx, my = jnp.mean(xt, 0), jnp.mean(yt, 0)
    smooth = (jnp.mean(jnp.sum((xt - mx) ** 2, 1)) + jnp.mean(jnp.sum((yt - my) ** 2, 1))
              + jnp.sum((mx - my) ** 2))
    to_q = jnp.mean(jnp.sum((xt - yt[:1]) ** 2, 1))
    to_p = jnp.mean(jnp.sum((yt - xt[:1]) ** 2, 1))
    direct = jnp.where(y_point, to_q, to_p)
    return smooth + jax.lax.stop_gradient(direct - smooth)


def unit_frame_host(x, y):
    """:func:`cloud_frame` on the host in float64 (for the host-only exact solver).

    Returns:
        (x̃, ỹ, e, x_point, y_point) as NumPy float64 arrays, a Python int and bools.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    big = max(float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    x_point = bool(np.all(x == x[:1]))
    y_point = bool(np.all(y == y[:1]))
    if not (np.isfinite(big) and big > 0):
        return x, y, 0, x_point, y_point
    a = int(np.frexp(big)[1]) - 1
    x1, y1 = np.ldexp(x, -a), np.ldexp(y, -a)
    c = 0.5 * (x1.mean(0) + y1.mean(0))
    x2, y2 = x1 - c, y1 - c
    spread = max(float(np.max(np.abs(x2))), float(np.max(np.abs(y2))))
    b = int(np.frexp(spread)[1]) - 1 if spread > 0 else 0
    return np.ldexp(x2, -b), np.ldexp(y2, -b), a + b, x_point, y_point
