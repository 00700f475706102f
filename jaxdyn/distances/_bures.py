"""Bures–Wasserstein W2 between Gaussians.

An eigh-based PSD square root (ott-jax 0.6's Bures cost is inaccurate for ill-conditioned
covariances) and its derivative.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._results import RESULTS, code, from_codes, status_codes
from ._checks import _as_float_array
from ._scale import _exponent, times_pow2, widen_half
from ._solution import W2Solution, scaled_closed_solution


def _sym(a):
    """The symmetric part of a (batch of) square matrices."""
    return 0.5 * (a + jnp.swapaxes(a, -1, -2))


def _eigh_psd(s):
    """Eigenvalues (clipped at 0; NaN for NaN and −inf) and eigenvectors of s's symmetric part."""
    w, u = jnp.linalg.eigh(_sym(s))
    return jnp.where(w > -jnp.inf, jnp.maximum(w, 0.0), jnp.nan), u


def _zero_cut(w):
    """Eigenvalues at or below d · eps · max(w) are treated as zero in the derivatives."""
    d = w.shape[-1]
    return d * jnp.finfo(w.dtype).eps * jnp.max(jnp.abs(w), axis=-1, keepdims=True)


def _check_square_stack(name, s):
    """Refuse an ``s`` that is not a stack of real square matrices (..., d, d).

    Raises:
        ValueError: naming ``s``, for a shape that is not (..., d, d).
        TypeError: naming ``s``, for a dtype other than float32, float64 or an integer
            (complex: the imaginary part would be dropped; half precision: eigh has none).
    """
    shape = tuple(np.shape(s))
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"{name} must be square matrices of shape (..., d, d), got shape {shape}")
    dtype = jnp.result_type(s)
    if not (jnp.issubdtype(dtype, jnp.integer) or dtype in (jnp.float32, jnp.float64)):
        raise TypeError(f"{name} must hold float32 or float64 numbers (eigh has no complex "
                        f"or half-precision path here), got dtype {dtype}")


@jax.custom_jvp
def sqrtm_psd(s: Float[Array, "... d d"]) -> Float[Array, "... d d"]:
    r"""Symmetric PSD square root ``R = U diag(sqrt(max(λ, 0))) Uᵀ`` from ``eigh``.

    The input is symmetrised first; negative rounding eigenvalues are clipped to 0.
    The derivative is the Daleckii-Krein formula for f = sqrt, well defined for repeated
    eigenvalues (unlike differentiating through eigh's eigenvectors):

        dR = U [ (Uᵀ dS U)_ij / (sqrt λ_i + sqrt λ_j) ] Uᵀ,

    with the entries where both λ_i, λ_j are (numerically) zero set to 0 (the derivative of
    sqrt is infinite there; 0 is the safe choice). Jittable, vmappable, batched over leading
    dimensions.

    Args:
        s: symmetric PSD matrices (..., d, d).

    Returns:
        The square roots R (..., d, d), symmetric PSD with R R = S (for PSD S).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses ``s`` not of shape
    (..., d, d), a TypeError a complex or half-precision ``s``.

    Dtypes: float32 or float64; integers are converted to JAX's default float; float16,
    bfloat16 (eigh has no half-precision path) and complex are refused (a TypeError naming
    ``s``). A NaN or ``−inf`` eigenvalue gives NaN (a finite negative one is clipped to 0).
    """
    _check_square_stack("s", s)
    w, u = _eigh_psd(s)
    return jnp.matmul(u * jnp.sqrt(w)[..., None, :], jnp.swapaxes(u, -1, -2),
                      precision=jax.lax.Precision.HIGHEST)


@sqrtm_psd.defjvp
def _sqrtm_psd_jvp(primals, tangents):
    (s,), (ds,) = primals, tangents
    w, u = _eigh_psd(s)
    r = jnp.sqrt(w)
    ut = jnp.swapaxes(u, -1, -2)
    out = jnp.matmul(u * r[..., None, :], ut, precision=jax.lax.Precision.HIGHEST)
    w = jnp.where(w > _zero_cut(w), w, 0.0)
    r = jnp.sqrt(w)
    den = r[..., :, None] + r[..., None, :]
    ok = den > 0
    k = jnp.where(ok, 1.0 / jnp.where(ok, den, 1.0), 0.0)
    dout = u @ ((ut @ _sym(ds) @ u) * k) @ ut
    return out, dout


@jax.custom_jvp
def trace_sqrtm_psd(c: Float[Array, "... d d"]) -> Float[Array, "..."]:
    r"""``tr(C^{1/2}) = Σ_i sqrt(max(λ_i(C), 0))`` for symmetric PSD C (symmetrised first).

    Derivative ``d tr C^{1/2} = Σ_i (u_iᵀ dC u_i) / (2 sqrt λ_i)``, with numerically zero
    eigenvalues contributing 0 (safe at rank deficiency). It needs only eigenvalue
    derivatives, so repeated eigenvalues are fine.

    Args:
        c: symmetric PSD matrices (..., d, d).

    Returns:
        The traces of their square roots, shape (...).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses ``c`` not of shape
    (..., d, d), a TypeError a complex or half-precision ``c``.

    Dtypes: float32 or float64; integers are converted to JAX's default float; float16,
    bfloat16 (eigh has no half-precision path) and complex are refused (a TypeError naming
    ``c``). A NaN or ``−inf`` eigenvalue gives NaN (a finite negative one is clipped to 0).
    """
    _check_square_stack("c", c)
    w, _ = _eigh_psd(c)
    return jnp.sum(jnp.sqrt(w), axis=-1)


@trace_sqrtm_psd.defjvp
def _trace_sqrtm_psd_jvp(primals, tangents):
    (c,), (dc,) = primals, tangents
    w, u = _eigh_psd(c)
    out = jnp.sum(jnp.sqrt(w), axis=-1)
    ok = w > _zero_cut(w)
    g = jnp.where(ok, 0.5 / jnp.sqrt(jnp.where(ok, w, 1.0)), 0.0)
    dw = jnp.einsum("...ji,...jk,...ki->...i", u, _sym(dc), u)
    return out, jnp.sum(g * dw, axis=-1)


#: a batch of means and of covariances
Mean = Float[Array, "... d"]
Cov = Float[Array, "... d d"]


def _gaussians_problem(m0, S0, m1, S1):
    """What is wrong with the shapes of two Gaussians (None if (..., d) and (..., d, d), one d)."""
    for mname, m, sname, c in (("m0", m0, "S0", S0), ("m1", m1, "S1", S1)):
        if m.ndim < 1 or c.ndim < 2 or c.shape[-1] != c.shape[-2] or c.shape[-1] != m.shape[-1]:
            return (f"{mname} must have shape (..., d) and {sname} shape (..., d, d) with the "
                    f"same d, got {mname}: {m.shape}, {sname}: {c.shape}")
    if m0.shape[-1] != m1.shape[-1]:
        return f"m0 and m1 must have the same d, got {m0.shape} and {m1.shape}"
    if m0.shape[-1] == 0:
        return f"m0 and m1 must have dimension d >= 1, got shapes {m0.shape} and {m1.shape}"
    for name, c in (("S0", S0), ("S1", S1)):
        if isinstance(c, jax.core.Tracer):
            continue  # a traced covariance: its negative eigenvalues are clipped to 0
        h = np.asarray(c, np.float64)
        if not np.all(np.isfinite(h)):
            continue  # NaN or inf: the result says ``nonfinite``
        # relative to each matrix's largest entry (brought to 1 by a power of two, so that
        # the check means the same at any scale and its eigenvalues cannot overflow)
        big = np.abs(h).max(axis=(-2, -1), keepdims=True)
        e = np.where(big > 0, np.frexp(big)[1], 0)
        h = np.ldexp(h, -e)
        e = e[..., 0, 0]  # the messages state the user's units
        scale = np.abs(h).max(axis=(-2, -1))
        eps = float(jnp.finfo(c.dtype).eps) if jnp.issubdtype(c.dtype, jnp.floating) else 2.2e-16
        tol = 100.0 * h.shape[-1] * eps * scale
        asym = np.abs(h - np.swapaxes(h, -1, -2)).max(axis=(-2, -1))
        lmin = np.linalg.eigvalsh(0.5 * (h + np.swapaxes(h, -1, -2)))[..., 0]
        if np.any(asym > tol):
            return (f"{name} must be symmetric (a covariance): max |{name} - {name}ᵀ| = "
                    f"{float(np.max(np.ldexp(asym, e))):.3e}")
        if np.any(lmin < -tol):
            return (f"{name} must be positive semi-definite (a covariance): min eigenvalue = "
                    f"{float(np.min(np.ldexp(lmin, e))):.3e}")
    return None


def bures_w2_squared(m0: Mean, S0: Cov, m1: Mean, S1: Cov) -> Float[Array, "..."]:
    r"""Squared W2 between N(m0, S0) and N(m1, S1) (Bures-Wasserstein), clipped at 0.

        W2^2 = |m0 - m1|^2 + tr(S0) + tr(S1) - 2 tr((S1^{1/2} S0 S1^{1/2})^{1/2})

    with eigh-based square roots (:func:`sqrtm_psd`, :func:`trace_sqrtm_psd`), so it is
    accurate for ill-conditioned and singular (PSD) covariances, jittable, vmappable and
    differentiable (also at repeated eigenvalues, e.g. S1 = I). The smooth choice for a
    loss. Covariances must be symmetric PSD: a concrete one that is not (beyond rounding,
    ``100 d eps max|S|``) is refused; a traced one that is not (the same allowance) gives NaN
    there. Within the allowance the covariance is symmetrised and a negative eigenvalue
    clipped to 0.

    Scale: the means' difference and the covariances are divided by a power of two 2^e (and
    4^e) that brings them to unit size (exact), and W2^2 is reported times 4^e: right at any
    scale whose W2^2 the dtype holds, translation-invariant in the means (a shift of 1e6
    keeps the digits); beyond, inf. The rescaling carries no gradient.

    Dtypes: float32 and float64 are computed in their dtype; float16 and bfloat16 are
    computed in float32 with a ``UserWarning`` (the result is float32); integers are
    converted to the float dtype of the other inputs; complex is refused (a TypeError naming
    the parameter).

    Args:
        m0: means (..., d) of the first Gaussians.
        S0: covariances (..., d, d) of the first Gaussians.
        m1: means (..., d) of the second Gaussians.
        S1: covariances (..., d, d) of the second Gaussians.

    Returns:
        W2^2, shape (...) (the inputs' batch shapes broadcast); NaN where an input is NaN or
        a traced covariance is not symmetric PSD.

    Raises:
        ValueError: if the shapes are not (..., d) and (..., d, d) with one d (d >= 1), or a
            concrete covariance is not symmetric PSD.

    An input of a complex dtype is refused by a TypeError naming it.

    Warns:
        UserWarning: float16 or bfloat16 input (computed in float32).
    """
    m0, S0, m1, S1 = _gaussians(m0, S0, m1, S1, "bures_w2_squared")
    problem = _gaussians_problem(m0, S0, m1, S1)
    if problem:
        raise ValueError(problem)
    out = _squared_back(*_bures_unit(m0, S0, m1, S1))
    if _traced(S0, S1):
        out = jnp.where(not_covariances(S0, S1), jnp.nan, out)
    return out


def _traced(*arrays):
    """Whether any of ``arrays`` is traced (its values unknown to the concrete checks)."""
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def clipped_bures_w2_squared(m0: Mean, S0: Cov, m1: Mean, S1: Cov) -> Float[Array, "..."]:
    """:func:`bures_w2_squared` with covariances symmetrised and negative eigenvalues clipped.

    For the package's losses, whose covariances come out of an ODE solve: a rank-deficient
    one may then have an eigenvalue a little below 0 beyond the public check's allowance,
    which this form reads as 0 (the W2² of the nearest covariance) rather than NaN.

    Returns:
      W2², as :func:`bures_w2_squared`.
    """
    return _squared_back(*_bures_unit(m0, S0, m1, S1))


def _gaussians(m0, S0, m1, S1, fn):
    """The four inputs as JAX arrays of a float dtype (half precision widened, with a warning)."""
    arrays = [_as_float_array(a, n) for a, n in zip((m0, S0, m1, S1), ("m0", "S0", "m1", "S1"))]
    return widen_half(arrays, fn)


def _covariance_tolerance(h):
    """The rounding allowance of the covariance checks, ``100 d eps max|h|``."""
    return 100.0 * h.shape[-1] * jnp.finfo(h.dtype).eps * jnp.max(jnp.abs(h), (-2, -1))


@jax.jit
def not_covariances(S0, S1):
    """Where S0 or S1 is not symmetric PSD beyond rounding: the concrete check's rule, traced.

    Each finite matrix is brought to unit size by a power of two (exact) and flagged where
    ``max |S − Sᵀ|`` or ``−λ_min(sym S)`` exceeds ``100 d eps max|S|``, the allowance of the
    concrete check in :func:`_gaussians_problem`; a matrix with a NaN or inf entry is not
    flagged (its result is ``nonfinite`` already). No gradient.

    Returns:
      A boolean array of the broadcast batch shape.
    """
    def bad(s):
        s = jax.lax.stop_gradient(s)
        finite = jnp.all(jnp.isfinite(s), (-2, -1))
        s = jnp.where(finite[..., None, None], s, 0.0)
        h = times_pow2(s, -_exponent(jnp.max(jnp.abs(s), (-2, -1)))[..., None, None])
        tol = _covariance_tolerance(h)
        asym = jnp.max(jnp.abs(h - jnp.swapaxes(h, -1, -2)), (-2, -1))
        lmin = jnp.linalg.eigvalsh(_sym(h))[..., 0]
        return finite & ((asym > tol) | (lmin < -tol))

    return bad(S0) | bad(S1)


@jax.jit
def _squared_back(sq, e):
    """W2² of the unit-size Gaussians in the user's units, ``4^e sq`` (one program)."""
    return times_pow2(times_pow2(sq, e), e)


@jax.jit
def _bures_unit(m0, S0, m1, S1):
    """W2² of the Gaussians brought to unit size, and the exponent e of their scale 2^e.

    The means' difference is formed after dividing both by the power of two at their largest
    |entry| (exact; it cannot overflow); the scale 2^e is the power of two at the larger of
    that difference's largest |entry| and the square root of the covariances' largest
    |entry|; the means' difference is divided by 2^e and the covariances by 4^e (exact up to
    underflow), so the closed form never squares a number beyond 4. The exponents carry no
    gradient (W2² = 4^e W2²(unit) for any fixed e).

    Returns:
        (W2² at unit size, e), of the broadcast batch shape.
    """
    stop = jax.lax.stop_gradient
    big_m = jnp.maximum(jnp.max(jnp.abs(stop(m0)), -1), jnp.max(jnp.abs(stop(m1)), -1))
    a = _exponent(big_m)
    dm = times_pow2(m0, -a[..., None]) - times_pow2(m1, -a[..., None])
    big_d = jnp.max(jnp.abs(stop(dm)), -1)
    e_d = jnp.where(big_d > 0, _exponent(big_d) + a, jnp.iinfo(jnp.int32).min // 4)
    big_s = jnp.maximum(jnp.max(jnp.abs(stop(S0)), (-2, -1)), jnp.max(jnp.abs(stop(S1)), (-2, -1)))
    # the power of two at sqrt(big_s): half its exponent, rounded up
    e_s = jnp.where(big_s > 0, (_exponent(big_s) + 1) // 2, jnp.iinfo(jnp.int32).min // 4)
    e = jnp.maximum(e_d, e_s)
    finite = jnp.isfinite(big_m) & jnp.isfinite(big_s)
    e = jnp.where(finite & (e > jnp.iinfo(jnp.int32).min // 4), e, 0).astype(jnp.int32)
    dm = times_pow2(dm, (a - e)[..., None])
    S0 = times_pow2(S0, -2 * e[..., None, None])
    S1 = times_pow2(S1, -2 * e[..., None, None])
    return _bures_w2_squared(dm, S0, jnp.zeros_like(dm), S1), e


@jax.jit
def _bures_w2_squared(m0, S0, m1, S1):
    """W2^2 of :func:`bures_w2_squared` after its checks (one program a shape).

    Called eagerly, op by op, it compiled some twenty small ones; inlined under a caller's jit.

    Returns:
        W2^2 clipped at 0, shape (...).
    """
    r0, r1 = sqrtm_psd(S0), sqrtm_psd(S1)
    # The covariance part tr S0 + tr S1 − 2 tr (S1^½ S0 S1^½)^½ equals min over orthogonal U of
    # ‖S0^½ − S1^½ U‖_F², attained at the polar factor U = P Qᵀ of S1^½ S0^½ = P Σ Qᵀ. Its value
    # is taken in that form, a sum of squares: no cancellation between the traces, and no
    # square roots of the small eigenvalues of S1^½ S0^½ S1^½, which lose their digits to
    # rounding (the ill-conditioned pair of tests/test_distances.py). Its derivative is that of
    # the trace form through trace_sqrtm_psd's JVP, defined also at zero and repeated
    # eigenvalues (a singular value decomposition's is not).
    mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    smooth = (jnp.trace(S0, axis1=-2, axis2=-1) + jnp.trace(S1, axis1=-2, axis2=-1)
              - 2.0 * trace_sqrtm_psd(mm(mm(r1, S0), r1)))
    P, _, Qt = jnp.linalg.svd(mm(r1, r0))
    value = jnp.sum((r0 - mm(r1, mm(P, Qt))) ** 2, axis=(-2, -1))
    cov_part = smooth + jax.lax.stop_gradient(value - smooth)
    return jnp.maximum(jnp.sum((m0 - m1) ** 2, axis=-1) + cov_part, 0.0)


def bures_w2(m0: Mean, S0: Cov, m1: Mean, S1: Cov) -> W2Solution:
    r"""W2 between N(m0, S0) and N(m1, S1) in closed form (Bures–Wasserstein).

    .. math::

        W_2^2 = |m_0 - m_1|^2 + \operatorname{tr}\big(S_0 + S_1
                - 2 (S_1^{1/2} S_0 S_1^{1/2})^{1/2}\big)      \qquad\text{(docs/math.md §B.11)}

    computed by :func:`bures_w2_squared` (eigh-based square roots). Exact up to rounding (no
    bias). Jittable, vmappable, batched over leading dimensions and differentiable: the
    square root is made safe at 0 (gradient 0 where the two Gaussians coincide instead of
    NaN). Near coincidence W2 is not smooth; use the squared form
    (:func:`bures_w2_squared`, or ``divergence``) in losses.

    Scale: as :func:`bures_w2_squared`, on unit-size inputs; ``value`` is reported times 2^e,
    so it is right wherever W2 is representable (``divergence`` may overflow to inf where W2
    does not); a W2 that overflows is ``nonfinite``.

    Dtypes: float32 and float64 are computed in their dtype; float16 and bfloat16 are
    computed in float32 with a ``UserWarning`` (the result is float32); integers are
    converted to the float dtype of the other inputs; complex is refused (a TypeError naming
    the parameter).

    Args:
        m0: means (..., d) of the first Gaussians.
        S0: covariances (..., d, d) of the first Gaussians (symmetric PSD).
        m1: means (..., d) of the second Gaussians.
        S1: covariances (..., d, d) of the second Gaussians (symmetric PSD).

    Returns:
        :class:`W2Solution` (``method="bures"``) of the broadcast batch shape: ``value`` is
        W2, ``divergence`` W2^2; ``result`` is ``nonfinite`` where an input is not finite,
        and ``invalid_input`` (value and divergence NaN) where a traced covariance is not
        symmetric PSD beyond rounding (a concrete one is refused).

    Raises:
        ValueError: the shape and covariance errors of :func:`bures_w2_squared`.

    An input of a complex dtype is refused by a TypeError naming it.

    Warns:
        UserWarning: float16 or bfloat16 input (computed in float32).
    """
    m0, S0, m1, S1 = _gaussians(m0, S0, m1, S1, "bures_w2")
    problem = _gaussians_problem(m0, S0, m1, S1)
    if problem:
        raise ValueError(problem)
    sq, e = _bures_unit(m0, S0, m1, S1)
    if not _traced(S0, S1):
        return _bures_solution(sq, e)
    return _invalid_where(_bures_solution(sq, e), not_covariances(S0, S1))


@jax.jit
def _bures_solution(sq, e):
    """The result of :func:`bures_w2` from W2^2 at unit size and its scale 2^e (one program)."""
    return scaled_closed_solution(sq, e, "zero", "bures")


def _invalid_where(sol, bad):
    """``sol`` with NaN value and divergence and status ``invalid_input`` where ``bad``."""
    nan = lambda a: jnp.where(bad, jnp.nan, a)  # noqa: E731
    codes = jnp.where(bad, code(RESULTS.invalid_input), status_codes(sol.result))
    return eqx.tree_at(lambda s: (s.value, s.divergence, s.result), sol,
                       (nan(sol.value), nan(sol.divergence), from_codes(codes)))
