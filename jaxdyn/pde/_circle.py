"""The mean-field equation on the circle S¹ on a uniform grid of M cells (docs/math.md §C).

    ∂_t ρ + ∂_θ(ρ v) = (σ²/2) ∂_θ² ρ,   v(θ) = ⟨t(θ), V m(θ)⟩,
    m(θ) = ∫ e^{β e(θ)ᵀB e(φ)} e(φ) ρ(φ) dφ / ∫ e^{β e(θ)ᵀB e(φ)} ρ(φ) dφ   (softmax; no denominator
    for ``normalization="unnormalized"``), e(θ) = (cos θ, sin θ), t(θ) = (−sin θ, cos θ), B = QᵀK.

Unknowns: the cell averages ρ_j of ρ on cells [θ_j − h/2, θ_j + h/2], θ_j = j h, h = 2π/M.

Velocity (spectral, at the faces θ_{j+1/2}). The point-value spectrum of ρ is the cell-average
spectrum divided by sinc(n/M) (the cell average of e^{inθ} is sinc(n/M) e^{inθ_j}); the two
convolutions are then evaluated at the faces by FFT (a half-cell phase shift). For a band-limited
ρ this gives the exact face velocity, so the finite-volume update below is exact for the cell
averages in the linear regime: the growth rate of a Fourier mode of the uniform state is λ_k to
rounding (``tests/test_pde.py``).

* ``kernel="fft"``: B = aI + bJ (J the rotation by π/2), i.e. e(θ)ᵀBe(φ) = a cos(θ−φ) + b sin(θ−φ)
  is a function of θ − φ: three circular convolutions (numerator, two components, and the
  denominator) by FFT, O(M log M). V is arbitrary (it acts on m after the convolutions).
* ``kernel="dense"``: any 2×2 B. e(θ)ᵀBe(φ) also has a part in cos(θ+φ), sin(θ+φ) that is not a
  function of θ − φ; the M×M kernel matrix at (faces, centres) is formed (row-shifted by its max,
  as a softmax) and applied by one matmul: O(M²) time and memory a step (M = 4096: 16.8 M
  entries, 134 MB in float64). ``"auto"`` picks fft when concrete Q, K give B of the form
  aI + bJ, and dense for traced Q or K (a static choice that must hold for every value).

Transport: a finite-volume upwind flux with a MUSCL reconstruction limited by the monotonised
central (MC) limiter: face values lie between neighbouring cell averages, so ρ ≥ 0 is kept by
every forward-Euler stage with dt (2 v_max/h + σ²/h²) ≤ 1 (Heun = SSPRK2 is a convex combination
of such stages). The flux differences telescope: mass is conserved to rounding.

Noise: a conservative diffusive flux −(σ²/2) ∂_θρ at the faces, either ``"fd"``
((ρ_{j+1} − ρ_j)/h: positivity-preserving, second order) or ``"spectral"`` (the exact derivative of
the band-limited ρ at the face: the rate −σ²k²/2 is exact; positivity not guaranteed for
under-resolved profiles).
"""

from __future__ import annotations

import math
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_bounds, check_finite, check_integer, nan_where, real_arrays, scalar_domain
from ..models import Domain
from ..models._params import check_domain

__all__ = ["CircleDensity", "circle_grid", "uniform_density", "cos_mode", "mode_amplitude",
           "velocity_bound", "cfl_dt"]

KERNELS = ("auto", "fft", "dense")
NORMALIZATIONS = ("softmax", "unnormalized")
DIFFUSIONS = ("fd", "spectral")
LIMITERS = ("mc", "minmod")


def default_float():
    """JAX's default floating dtype (float64 with ``jax_enable_x64``, else float32): no array made."""
    return jax.dtypes.canonicalize_dtype(np.float64)


def host_value(x, dtype):
    """``x`` as a NumPy array of ``dtype`` on the host when it is concrete, None when traced.

    Concrete: a Python number, a NumPy array or a concrete ``jax.Array``. Constructors check
    their inputs on these host copies: no device computation runs when a model is built (also
    inside ``jax.jit`` from NumPy weights), and traced inputs are left to the program
    (``solve_density`` flags them through its result code).

    Returns:
      A NumPy array, or None.
    """
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x, dtype)


def to_leaf(x, host, dtype):
    """An array leaf of ``dtype``: the host copy as it is (no conversion program), or the traced value converted."""
    return jnp.asarray(x, dtype) if host is None else jnp.asarray(host)


def circle_grid(m: int, dtype=None):
    """Cell centres θ_j = j·2π/M (j = 0..M−1) and faces θ_{j+1/2} = θ_j + h/2.

    Args:
      m: the number of cells M (an integer ≥ 1; a ValueError otherwise).
      dtype: the floating dtype (default: JAX's default float).

    Returns:
      (centres, faces): two (M,) arrays.
    """
    m = check_integer("m (number of cells)", m, minimum=1, integral_floats=True)
    dtype = dtype or default_float()
    h = 2 * math.pi / m
    c = jnp.arange(m, dtype=dtype) * h
    return c, c + h / 2


def uniform_density(m: int, dtype=None):
    """The uniform probability density 1/(2π) on M cells.

    Args:
      m: the number of cells M (an integer ≥ 1; a ValueError otherwise).
      dtype: the floating dtype (default: JAX's default float).

    Returns:
      (M,) cell averages, all 1/(2π).
    """
    m = check_integer("m (number of cells)", m, minimum=1, integral_floats=True)
    dtype = dtype or default_float()
    return jnp.full((m,), 1.0 / (2 * math.pi), dtype)


def cos_mode(m: int, k: int, dtype=None, phase=0.0):
    """Cell averages of cos(kθ + phase): sinc(k/M) cos(kθ_j + phase).

    Args:
      m: the number of cells M (an integer ≥ 1; a ValueError otherwise).
      k: the mode (an integer; a ValueError otherwise).
      dtype: the floating dtype (default: JAX's default float).
      phase: the phase (radians), finite (a concrete one that is not is a ValueError). A
        traced value outside the domain gives NaN.

    Returns:
      (M,) cell averages (the cell average of e^{ikθ} is sinc(k/M) e^{ikθ_j}).
    """
    k = check_integer("k (the mode)", k, integral_floats=True)
    check_finite("phase", phase)
    bad = scalar_domain("phase", phase)[1]
    c, _ = circle_grid(m, dtype)
    return nan_where(bad, float(np.sinc(k / m)) * jnp.cos(k * c + phase))  # (a NumPy float64 scalar promoted float32)


def mode_amplitude(rho, k: int):
    """Complex amplitude of the k-th Fourier mode of the cell averages: (2/M) Σ_j ρ_j e^{−ikθ_j}.

    For k ≥ 1, cos(kθ) has amplitude sinc(k/M) (its cell averages carry that factor).

    Args:
      rho: (..., M) cell averages.
      k: the mode, 0 ≤ k ≤ M/2 (may be traced: then it is not checked).

    Returns:
      (...,) complex amplitudes.

    Raises:
      ValueError: a concrete k that is not an integer in [0, M/2], or concrete cell averages
        that are not finite.

    Dtypes: float32 or float64; integers are converted to JAX's default float; float16,
    bfloat16 (the FFT has no half-precision path) and complex are refused (a TypeError naming
    ``rho``).
    """
    (rho,) = real_arrays(fn="mode_amplitude", rho=rho)
    m = np.shape(rho)[-1]
    check_finite("rho", rho)
    if not isinstance(k, jax.core.Tracer):
        check_integer("k (the mode)", k, minimum=0)
    if not isinstance(k, jax.core.Tracer) and not 0 <= int(k) <= m // 2:
        raise ValueError(f"k must lie in [0, M/2] = [0, {m // 2}] for M = {m} cells, got {k}")
    return 2 * jnp.fft.rfft(jnp.asarray(rho), axis=-1)[..., k] / m


#: the grid resolves the attention kernel e^{β⟨·⟩} while its width 1/√(β‖B‖₂) is at least
#: this many cells (on a coarser grid the discrete growth rates fall far below λ_k)
RESOLVED_CELLS = 1.0


def _warn_unresolved(beta_norm: float, m: int):
    """Warn (not an error: the solve runs) when the kernel is narrower than ``RESOLVED_CELLS`` cells."""
    h = 2 * math.pi / m
    width = 1.0 / math.sqrt(beta_norm) if beta_norm > 0 else math.inf
    if width < RESOLVED_CELLS * h:
        need = 2 ** math.ceil(math.log2(2 * math.pi * RESOLVED_CELLS / width))
        warnings.warn(f"CircleDensity: the attention kernel's width 1/√(β‖B‖₂) = {width:.3g} is "
                      f"below {RESOLVED_CELLS:g} cell (h = 2π/M = {h:.3g}, M = {m}): this grid does "
                      f"not resolve β‖B‖₂ = {beta_norm:.4g}, and growth rates and cluster profiles "
                      f"are grid artefacts; use M >= {need}", stacklevel=_caller_level())


def _caller_level() -> int:
    """The warnings stack level of the first frame outside jaxdyn and equinox (the user's)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and any(k in frame.f_code.co_filename for k in ("jaxdyn", "equinox")):
        level, frame = level + 1, frame.f_back
    return level


def _rotation_part(B):
    """E(θ)ᵀBe(φ) = a cos(θ−φ) + b sin(θ−φ) + c cos(θ+φ) + d sin(θ+φ): (a, b, c, d)."""
    a = (B[0, 0] + B[1, 1]) / 2
    b = (B[1, 0] - B[0, 1]) / 2
    c = (B[0, 0] - B[1, 1]) / 2
    d = (B[0, 1] + B[1, 0]) / 2
    return a, b, c, d


def _safe_sqrt(x):
    """√x for x ≥ 0 with a zero derivative at 0 (the square root's is infinite there)."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def norm_2x2(V):
    """‖V‖₂ of a 2 × 2 matrix in closed form: (√(‖V‖_F² + 2|det V|) + √(‖V‖_F² − 2|det V|))/2.

    (σ₁ ± σ₂ = √(σ₁² + σ₂² ± 2σ₁σ₂); no SVD in the program, and a finite derivative where the two
    singular values meet, e.g. V = I.)

    Returns:
      A scalar array.
    """
    f2 = jnp.sum(V * V)
    det2 = 2 * jnp.abs(V[0, 0] * V[1, 1] - V[0, 1] * V[1, 0])
    return (_safe_sqrt(f2 + det2) + _safe_sqrt(jnp.maximum(f2 - det2, 0.0))) / 2


def check_weights(Q, K, V, d, dtype, what):
    """Q, K, V as (d, d) arrays of one floating dtype (default: Q's, else JAX's default).

    Shared by the S¹ and S² densities and the S¹ particle field. The shapes and dtype are read
    without any device computation; the host copies (NumPy, in that dtype) are None for traced
    weights.

    Returns:
      (Q, K, V, dtype, (Q, K, V) on the host or None each).

    Raises:
      ValueError: a weight that is not (d, d), or a concrete Q or K that is not finite (a
        non-finite V makes the solve non-finite, which the drivers report).
    """
    if dtype is None:
        qd = getattr(Q, "dtype", None)
        qd = np.asarray(Q).dtype if qd is None else np.dtype(qd)
        dtype = jax.dtypes.canonicalize_dtype(qd) if jnp.issubdtype(qd, jnp.floating) else default_float()
    for name, w in (("Q", Q), ("K", K), ("V", V)):
        if np.shape(w) != (d, d):
            raise ValueError(f"{name} must be a {d}x{d} matrix {what}, got shape {np.shape(w)}")
        if name != "V":  # the constructors read B = QᵀK on the host (a NaN V: a nonfinite solve)
            check_finite(name, w, what=" (weights: B = QᵀK is read on the host)")
    host = tuple(host_value(w, dtype) for w in (Q, K, V))
    Q, K, V = (to_leaf(w, hw, dtype) for w, hw in zip((Q, K, V), host))
    return Q, K, V, dtype, host


#: the domains of the densities' parameters (the models' shared checks, ``jaxdyn.models.Domain``)
BETA = Domain("positive", 0, "inverse temperature")
SIGMA = Domain("nonnegative", 0, "noise")


def check_temperature(beta, sigma, dtype):
    """β and σ as scalars of ``dtype``, checked on the host where concrete (β > 0, σ ≥ 0).

    A ValueError (through :func:`jaxdyn.models._params.check_domain`) refuses β or σ not a
    scalar, a concrete β not finite and > 0, a concrete σ not finite and ≥ 0.

    Returns:
      (beta, sigma, beta on the host or None).
    """
    check_domain("beta", beta, BETA)
    check_domain("sigma", sigma, SIGMA)
    hb, hs = host_value(beta, dtype), host_value(sigma, dtype)
    return to_leaf(beta, hb, dtype), to_leaf(sigma, hs, dtype), hb


def _is_rotation(B, rtol):
    """B (NumPy, on the host) of the form aI + bJ to ``rtol`` relative to its largest entry."""
    _, _, c, d = _rotation_part(B)
    return abs(c) + abs(d) <= rtol * (np.abs(B).max() + 1e-300)


class CircleDensity(eqx.Module):
    r"""The right-hand side of the mean-field equation on S¹ for the cell averages ρ (shape (M,)).

    A vector field ``field(t, rho, args) -> dρ/dt``, usable as a ``diffrax.ODETerm``:
    ∂_t ρ + ∂_θ(ρ v) = (σ²/2) ∂_θ² ρ with v(θ) = ⟨t(θ), V m(θ)⟩ and m(θ) the softmax mean of
    e(φ) under the weights e^{β e(θ)ᵀBe(φ)} ρ(φ), B = QᵀK (module docstring).

    Building a model runs no device computation: its inputs are checked on the host where they
    are concrete (NumPy weights inside ``jax.jit`` included); traced β, σ are checked by
    :func:`solve_density` (the result code ``invalid_input``).

    Args:
      Q: (2, 2) query weights on the plane of S¹.
      K: (2, 2) key weights.
      V: (2, 2) value weights.
      beta: inverse temperature β > 0 (an array leaf: vmap over a stack of models sweeps it).
      m: grid size M ≥ 8 (static).
      sigma: noise σ ≥ 0 (an array leaf).
      kernel: ``"fft"`` (B = aI + bJ, O(M log M)), ``"dense"`` (any B, O(M²)), or ``"auto"``:
        ``"fft"`` when concrete Q, K give B = aI + bJ (to 1e-14 relative), else ``"dense"``.
        Traced Q or K (weights that are jit arguments, vmapped or differentiated) take
        ``"dense"``: the choice is static, and only the dense kernel is right for every B a
        traced value can hold (its gradient in Q, K is the whole gradient; the FFT kernel's
        sees a and b only).
      normalization: ``"softmax"`` or ``"unnormalized"`` (weights e^{β⟨Qx,Ky⟩} against ρ).
      diffusion: ``"fd"`` or ``"spectral"`` (see the module docstring).
      limiter: ``"mc"`` or ``"minmod"``.
      dtype: the floating dtype of the leaves (default: Q's, else JAX's default float).

    Attributes:
      Q, K, V, beta, sigma: the array leaves.
      m, kernel, normalization, diffusion, limiter: static settings (``kernel`` resolved).

    Raises:
      ValueError: a weight not 2 × 2, a concrete Q or K not finite, β or σ not a scalar, a concrete
        β not finite and > 0 or σ not finite and ≥ 0, m not an integer ≥ 8, an unknown option,
        or ``kernel="fft"`` with a concrete B not of the form aI + bJ.

    Warns:
      UserWarning: concrete β, Q, K whose kernel width 1/√(β‖B‖₂) is below one cell (the grid
        does not resolve the kernel; the warning names the M it needs).
    """

    Q: jax.Array
    K: jax.Array
    V: jax.Array
    beta: jax.Array
    sigma: jax.Array
    m: int = eqx.field(static=True)
    kernel: str = eqx.field(static=True, default="auto")
    normalization: str = eqx.field(static=True, default="softmax")
    diffusion: str = eqx.field(static=True, default="fd")
    limiter: str = eqx.field(static=True, default="mc")

    def __init__(self, Q, K, V, beta, m, *, sigma=0.0, kernel="auto", normalization="softmax",
                 diffusion="fd", limiter="mc", dtype=None):
        Q, K, V, dtype, (hq, hk, _) = check_weights(Q, K, V, 2, dtype, "(the weights on the plane of S¹)")
        m = check_integer("m (grid size)", m, minimum=8, integral_floats=True)
        for name, v, opts in (("kernel", kernel, KERNELS), ("normalization", normalization, NORMALIZATIONS),
                              ("diffusion", diffusion, DIFFUSIONS), ("limiter", limiter, LIMITERS)):
            if v not in opts:
                raise ValueError(f"{name} must be one of {opts}, got {v!r}")
        self.Q, self.K, self.V = Q, K, V
        self.beta, self.sigma, hb = check_temperature(beta, sigma, dtype)
        B = None if hq is None or hk is None else hq.T @ hk  # on the host, in the model's dtype
        if kernel == "auto":
            kernel = "fft" if B is not None and _is_rotation(B, 1e-14) else "dense"
        elif kernel == "fft" and B is not None and not _is_rotation(B, 1e-12):
            raise ValueError("kernel='fft' needs B = QᵀK of the form aI + bJ (a kernel in θ − φ "
                             "only); this B has a cos(θ+φ)/sin(θ+φ) part: use kernel='dense'")
        self.m = int(m)
        self.kernel = kernel
        self.normalization = normalization
        self.diffusion = diffusion
        self.limiter = limiter
        if B is not None and hb is not None:
            # on the host: β‖B‖₂ (β, Q or K traced: no warning)
            B64 = hq.astype(np.float64).T @ hk.astype(np.float64)
            _warn_unresolved(float(hb) * float(np.linalg.norm(B64, 2)), self.m)

    @property
    def h(self):
        """The cell width h = 2π/M."""
        return 2 * math.pi / self.m

    @property
    def shape(self):
        """The shape (M,) of the cell averages."""
        return (self.m,)

    @property
    def cell_measure(self):
        """The cell length h (mass = h Σ_j ρ_j)."""
        return self.h

    # ---- spectral helpers -------------------------------------------------------------
    def _freqs(self, dtype):
        return jnp.arange(self.m // 2 + 1, dtype=dtype)

    def point_spectrum(self, rho):
        """The rfft of the band-limited point values: the cell-average spectrum / sinc(n/M).

        Args:
          rho: (M,) cell averages.

        Returns:
          (M/2 + 1,) complex spectrum.
        """
        n = self._freqs(rho.dtype)
        return jnp.fft.rfft(rho) / jnp.sinc(n / self.m)

    def _at_faces(self, spec):
        """Band-limited values at the faces θ_j + h/2 of a spectrum on the centres."""
        n = self._freqs(jnp.real(spec).dtype)
        return jnp.fft.irfft(spec * jnp.exp(1j * n * self.h / 2), n=self.m)

    def _shift(self):
        """S = β‖B‖₂, the maximum of β e(θ)ᵀBe(φ) (the kernel is evaluated as e^{β⟨·⟩ − s}).

        (A larger shift such as β‖B‖_F, √2 β for B = I, bounds every kernel value by
        e^{−0.41β}: subnormal then 0 in float32 from β ≈ 200, a density frozen with status
        ``successful``.) 2 × 2 closed form: ‖B‖₂² = (‖B‖_F² + √(‖B‖_F⁴ − 4 det² B)) / 2.
        No derivative flows through it: the shift cancels in the softmax ratio and against the
        e^{s} of the unnormalised field (and √ at 0, B = I, has an infinite one).

        Returns:
          A scalar array.
        """
        B = jax.lax.stop_gradient(self.Q.T @ self.K)
        f2 = jnp.sum(B * B)
        det = B[0, 0] * B[1, 1] - B[0, 1] * B[1, 0]
        return jax.lax.stop_gradient(self.beta) * jnp.sqrt(
            (f2 + jnp.sqrt(jnp.maximum(f2 * f2 - 4 * det * det, 0.0))) / 2)

    def _moments(self, rho):
        """(Nc, Ns, D) at the faces: ∫ k(θ,φ) (cos φ, sin φ, 1) ρ(φ) dφ with k = e^{β⟨·⟩ − s}."""
        spec = self.point_spectrum(rho)
        p = jnp.fft.irfft(spec, n=self.m)  # point values at the centres
        c, f = circle_grid(self.m, rho.dtype)
        B = self.Q.T @ self.K
        s = self._shift()
        if self.kernel == "fft":
            a, b, _, _ = _rotation_part(B)
            kern = jnp.exp(self.beta * (a * jnp.cos(c) + b * jnp.sin(c)) - s)
            khat = jnp.fft.rfft(kern) * self.h
            out = [self._at_faces(khat * jnp.fft.rfft(g)) for g in (p * jnp.cos(c), p * jnp.sin(c), p)]
            return out[0], out[1], out[2], s
        ef = jnp.stack([jnp.cos(f), jnp.sin(f)], -1)
        ec = jnp.stack([jnp.cos(c), jnp.sin(c)], -1)
        logits = self.beta * (ef @ B @ ec.T)
        # a shift per row (no derivative through it: it cancels, as s does)
        rowmax = jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
        w = jnp.exp(logits - rowmax)
        g = jnp.stack([p * ec[:, 0], p * ec[:, 1], p], -1) * self.h
        mom = jnp.matmul(w, g, precision="highest")
        if self.normalization != "softmax":
            # the common factor cancels in the softmax ratio; leaving it out there keeps the
            # normaliser O(1) (a row whose largest logit lies far below s underflowed)
            mom = mom * jnp.exp(rowmax - s)
        return mom[:, 0], mom[:, 1], mom[:, 2], s

    def velocity(self, rho):
        """The angular velocity v(θ_{j+1/2}) = ⟨t(θ), V m(θ)⟩ at the M faces.

        Args:
          rho: (M,) cell averages.

        Returns:
          (M,) velocities at the faces θ_j + h/2.
        """
        nc, ns, d, s = self._moments(rho)
        _, f = circle_grid(self.m, rho.dtype)
        if self.normalization == "softmax":
            tiny = jnp.finfo(rho.dtype).tiny
            dpos = jnp.maximum(d, tiny)
            mx, my = nc / dpos, ns / dpos
            # m is a convex combination of unit vectors: |m| <= 1 (FFT rounding where the
            # kernel weight is ~e^{-2βa} could break it; clip)
            r = jnp.sqrt(mx * mx + my * my)
            scale = jnp.where(r > 1, 1 / jnp.maximum(r, 1), 1.0)
            scale = jnp.where(d > 0, scale, 0.0)
            mx, my = mx * scale, my * scale
        else:
            es = jnp.exp(s)
            mx, my = nc * es, ns * es
        X0 = self.V[0, 0] * mx + self.V[0, 1] * my
        X1 = self.V[1, 0] * mx + self.V[1, 1] * my
        return -jnp.sin(f) * X0 + jnp.cos(f) * X1

    def _face_states(self, rho):
        dm = rho - jnp.roll(rho, 1)   # ρ_j − ρ_{j−1}
        dp = jnp.roll(rho, -1) - rho  # ρ_{j+1} − ρ_j
        same = (dm * dp) > 0
        if self.limiter == "mc":
            mag = jnp.minimum(jnp.minimum(2 * jnp.abs(dm), 2 * jnp.abs(dp)), jnp.abs(dm + dp) / 2)
        else:
            mag = jnp.minimum(jnp.abs(dm), jnp.abs(dp))
        slope = jnp.where(same, jnp.sign(dm) * mag, 0.0)
        left = rho + slope / 2                     # at face j+1/2, from cell j
        right = jnp.roll(rho - slope / 2, -1)      # at face j+1/2, from cell j+1
        return left, right

    def flux(self, rho):
        """The total flux at the faces j+1/2: advective upwind MUSCL plus diffusive −(σ²/2)∂_θρ.

        Args:
          rho: (M,) cell averages.

        Returns:
          (M,) fluxes at the faces θ_j + h/2.
        """
        v = self.velocity(rho)
        left, right = self._face_states(rho)
        F = jnp.maximum(v, 0) * left + jnp.minimum(v, 0) * right
        if self.diffusion == "fd":
            grad = (jnp.roll(rho, -1) - rho) / self.h
        else:
            spec = self.point_spectrum(rho)
            grad = self._at_faces(1j * self._freqs(rho.dtype) * spec)
        return F - 0.5 * self.sigma ** 2 * grad

    def __call__(self, t, rho, args=None):
        """The right-hand side dρ_j/dt = −(F_{j+1/2} − F_{j−1/2})/h.

        Args:
          t: time (unused: the field is autonomous).
          rho: (M,) cell averages.
          args: unused (diffrax's signature).

        Returns:
          (M,) time derivatives of the cell averages.
        """
        F = self.flux(rho)
        return -(F - jnp.roll(F, 1)) / self.h


def traced_positive(v):
    """``v``, or NaN where a traced ``v`` is not > 0 (a concrete one is checked on the host)."""
    if not isinstance(v, jax.core.Tracer):
        return v
    return jnp.where(v > 0, v, jnp.nan)


def velocity_bound(model: CircleDensity):
    """An upper bound of |v|: ‖V‖₂ (softmax, since |m| ≤ 1) or ‖V‖₂ e^{s} (unnormalised).

    Args:
      model: a :class:`CircleDensity`.

    Returns:
      A scalar array (traceable; ‖V‖₂ in closed form, no SVD).
    """
    vn = norm_2x2(model.V)
    if model.normalization == "softmax":
        return vn
    return vn * jnp.exp(model._shift())


def cfl_dt(model: CircleDensity, cfl: float = 0.9):
    """The positivity step: dt (2 v_max/h + σ²/h²) = cfl (≤ 1), the fd diffusion's.

    The fd diffusion's largest eigenvalue is 2σ²/h². Spectral diffusion's is (σ²/2)(π/h)²: its
    term is (π²/4) σ²/h², which keeps Heun's stability limit |dt λ| ≤ 2 (σ²/h² there would
    exceed it: NaN).

    Args:
      model: a :class:`CircleDensity`.
      cfl: the CFL number (≤ 1 keeps ρ ≥ 0 with Heun).

    Returns:
      A scalar array, the step (traceable; NaN for a traced cfl that is not > 0).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses a concrete cfl that is
    not a finite number > 0.
    """
    check_bounds("cfl", cfl, low=0, low_open=True, what=" (the CFL number)")
    h = model.h
    diff = model.sigma ** 2 / h ** 2 * (1.0 if model.diffusion == "fd" else math.pi ** 2 / 4)
    return traced_positive(cfl) / (2 * velocity_bound(model) / h + diff)
