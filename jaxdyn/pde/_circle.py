"""The mean-field equation on the circle S¹ on a uniform grid of M cells (docs/math.md §C):

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
  entries, 134 MB in float64). ``"auto"`` picks fft when B is of the form aI + bJ (concretely).

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



__all__ = ["CircleDensity", "circle_grid", "uniform_density", "cos_mode", "mode_amplitude",
           "velocity_bound", "cfl_dt"]

KERNELS = ("auto", "fft", "dense")
NORMALIZATIONS = ("softmax", "unnormalized")
DIFFUSIONS = ("fd", "spectral")
LIMITERS = ("mc", "minmod")


def circle_grid(m: int, dtype=None):
    """Cell centres θ_j = j·2π/M (j = 0..M−1) and faces θ_{j+1/2}."""
    dtype = dtype or jnp.zeros(()).dtype
    h = 2 * math.pi / m
    c = jnp.arange(m, dtype=dtype) * h
    return c, c + h / 2


def uniform_density(m: int, dtype=None):
    """The uniform probability density 1/(2π) on M cells."""
    dtype = dtype or jnp.zeros(()).dtype
    return jnp.full((m,), 1.0 / (2 * math.pi), dtype)


def cos_mode(m: int, k: int, dtype=None, phase=0.0):
    """Cell averages of cos(kθ + phase): sinc(k/M) cos(kθ_j + phase)."""
    c, _ = circle_grid(m, dtype)
    return float(np.sinc(k / m)) * jnp.cos(k * c + phase)  # (a NumPy float64 scalar promoted float32)


def mode_amplitude(rho, k: int):
    """Complex amplitude of the k-th Fourier mode of the cell averages: (2/M) Σ_j ρ_j e^{−ikθ_j}
    (k ≥ 1), so cos(kθ) has amplitude sinc(k/M)."""
    m = rho.shape[-1]
    if not isinstance(k, jax.core.Tracer) and not 0 <= int(k) <= m // 2:
        raise ValueError(f"k must lie in [0, M/2] = [0, {m // 2}] for M = {m} cells, got {k}")
    return 2 * jnp.fft.rfft(rho, axis=-1)[..., k] / m


#: the grid resolves the attention kernel e^{β⟨·⟩} while its width 1/√(β‖B‖₂) is at least
#: this many cells (measured, B = I: at β = 1000 the discrete growth rates are 7-11 times below
#: λ_k on M = 64 cells, width 0.32 cells, and equal to 5 digits on M = 512, 2.6 cells)
RESOLVED_CELLS = 1.0


def _warn_unresolved(beta_norm: float, m: int):
    """A warning (not an error: the solve runs) when the kernel is narrower than
    ``RESOLVED_CELLS`` cells of the grid of ``m`` cells."""
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
    """e(θ)ᵀBe(φ) = a cos(θ−φ) + b sin(θ−φ) + c cos(θ+φ) + d sin(θ+φ)."""
    a = (B[0, 0] + B[1, 1]) / 2
    b = (B[1, 0] - B[0, 1]) / 2
    c = (B[0, 0] - B[1, 1]) / 2
    d = (B[0, 1] + B[1, 0]) / 2
    return a, b, c, d



def check_weights(Q, K, V, d, dtype, what):
    """Q, K, V as (d, d) arrays of one floating dtype (default: Q's, else JAX's default),
    each shape checked; returns (Q, K, V, dtype). Shared by the S¹ and S² densities."""
    if dtype is None:
        qd = jnp.asarray(Q).dtype
        dtype = qd if jnp.issubdtype(qd, jnp.floating) else jnp.zeros(()).dtype
    Q, K, V = (jnp.asarray(w, dtype) for w in (Q, K, V))
    for name, w in (("Q", Q), ("K", K), ("V", V)):
        if w.shape != (d, d):
            raise ValueError(f"{name} must be a {d}x{d} matrix {what}, got shape {w.shape}")
    return Q, K, V, dtype

class CircleDensity(eqx.Module):
    r"""The right-hand side of the mean-field equation on S¹ for the cell averages ρ (shape (M,)):
    a vector field ``field(t, rho, args) -> dρ/dt``, usable as a ``diffrax.ODETerm``.

    Args:
      Q, K, V: (2, 2) arrays (the weights restricted to the plane).
      beta: inverse temperature β > 0; sigma: noise σ ≥ 0 (array leaves: vmap over a stack
        of models sweeps them).
      m: grid size M (static).
      kernel: ``"fft"`` (B = aI + bJ, O(M log M)), ``"dense"`` (any B, O(M²)), ``"auto"``.
      normalization: ``"softmax"`` or ``"unnormalized"`` (weights e^{β⟨Qx,Ky⟩} against ρ).
      diffusion: ``"fd"`` or ``"spectral"`` (see the module docstring); limiter: ``"mc"`` or
        ``"minmod"``.
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
        Q, K, V, dtype = check_weights(Q, K, V, 2, dtype, "(the weights on the plane of S¹)")
        if int(m) != m or m < 8:
            raise ValueError(f"m (grid size) must be an integer >= 8, got {m!r}")
        for name, v, opts in (("kernel", kernel, KERNELS), ("normalization", normalization, NORMALIZATIONS),
                              ("diffusion", diffusion, DIFFUSIONS), ("limiter", limiter, LIMITERS)):
            if v not in opts:
                raise ValueError(f"{name} must be one of {opts}, got {v!r}")
        self.Q, self.K, self.V = Q, K, V
        self.beta = jnp.asarray(beta, dtype)
        self.sigma = jnp.asarray(sigma, dtype)
        if self.beta.ndim or self.sigma.ndim:
            raise ValueError("beta and sigma must be scalars; to sweep them vmap over a stack of models")
        if not isinstance(self.beta, jax.core.Tracer) and not bool(self.beta > 0):
            raise ValueError(f"beta (inverse temperature) must be > 0, got {float(self.beta)}")
        if not isinstance(self.sigma, jax.core.Tracer) and not bool(self.sigma >= 0):
            raise ValueError(f"sigma (noise) must be >= 0, got {float(self.sigma)}")
        if kernel == "auto":
            B = np.asarray(Q).T @ np.asarray(K) if not isinstance(Q, jax.core.Tracer) else None
            if B is None:
                raise ValueError("kernel='auto' needs concrete Q, K; pass kernel='fft' or 'dense'")
            _, _, c, d = _rotation_part(B)
            kernel = "fft" if abs(c) + abs(d) <= 1e-14 * (np.abs(B).max() + 1e-300) else "dense"
        elif kernel == "fft" and not isinstance(Q, jax.core.Tracer):
            _, _, c, d = _rotation_part(np.asarray(Q).T @ np.asarray(K))
            if abs(c) + abs(d) > 1e-12 * (np.abs(np.asarray(Q).T @ np.asarray(K)).max() + 1e-300):
                raise ValueError("kernel='fft' needs B = QᵀK of the form aI + bJ (a kernel in θ − φ "
                                 "only); this B has a cos(θ+φ)/sin(θ+φ) part: use kernel='dense'")
        self.m = int(m)
        self.kernel = kernel
        self.normalization = normalization
        self.diffusion = diffusion
        self.limiter = limiter
        if not any(isinstance(a, jax.core.Tracer) for a in (self.beta, Q, K)):
            # on the host (no device ops a model built): β‖B‖₂ (β, Q or K traced: no warning)
            B = np.asarray(Q, np.float64).T @ np.asarray(K, np.float64)
            _warn_unresolved(float(self.beta) * float(np.linalg.norm(B, 2)), self.m)

    @property
    def h(self):
        return 2 * math.pi / self.m

    @property
    def shape(self):
        return (self.m,)

    @property
    def cell_measure(self):
        """The cell length h (mass = h Σ_j ρ_j)."""
        return self.h

    # ---- spectral helpers -------------------------------------------------------------
    def _freqs(self, dtype):
        return jnp.arange(self.m // 2 + 1, dtype=dtype)

    def point_spectrum(self, rho):
        """rfft of the band-limited point values: the cell-average spectrum / sinc(n/M)."""
        n = self._freqs(rho.dtype)
        return jnp.fft.rfft(rho) / jnp.sinc(n / self.m)

    def _at_faces(self, spec):
        """Band-limited values at the faces θ_j + h/2 of a spectrum on the centres."""
        n = self._freqs(jnp.real(spec).dtype)
        return jnp.fft.irfft(spec * jnp.exp(1j * n * self.h / 2), n=self.m)

    def _shift(self):
        """s = β‖B‖₂, the maximum of β e(θ)ᵀBe(φ) (the kernel is evaluated as e^{β⟨·⟩ − s}).
        (β‖B‖_F, used before, is √2 β for B = I: every kernel value was at most e^{−0.41β},
        subnormal then 0 in float32 from β ≈ 200, and the density froze with status
        ``successful``.) 2 × 2 closed form: ‖B‖₂² = (‖B‖_F² + √(‖B‖_F⁴ − 4 det² B)) / 2."""
        B = self.Q.T @ self.K
        f2 = jnp.sum(B * B)
        det = B[0, 0] * B[1, 1] - B[0, 1] * B[1, 0]
        return self.beta * jnp.sqrt((f2 + jnp.sqrt(jnp.maximum(f2 * f2 - 4 * det * det, 0.0))) / 2)

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
        rowmax = jnp.max(logits, axis=1, keepdims=True)
        w = jnp.exp(logits - rowmax)
        g = jnp.stack([p * ec[:, 0], p * ec[:, 1], p], -1) * self.h
        mom = jnp.matmul(w, g, precision="highest")
        if self.normalization != "softmax":
            # the common factor cancels in the softmax ratio; leaving it out there keeps the
            # normaliser O(1) (a row whose largest logit lies far below s underflowed)
            mom = mom * jnp.exp(rowmax - s)
        return mom[:, 0], mom[:, 1], mom[:, 2], s

    def velocity(self, rho):
        """Angular velocity v(θ_{j+1/2}) at the M faces."""
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
        """Total flux at the faces j+1/2 (advective upwind MUSCL + diffusive)."""
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
        F = self.flux(rho)
        return -(F - jnp.roll(F, 1)) / self.h


@eqx.filter_jit
def spectral_norm(V):
    """‖V‖₂ (an SVD, in one jitted program)."""
    return jnp.linalg.norm(V, ord=2)


def velocity_bound(model: CircleDensity):
    """An upper bound of |v| (softmax: ‖V‖₂ since |m| ≤ 1; unnormalised: ‖V‖₂ e^{s})."""
    vn = spectral_norm(model.V)
    if model.normalization == "softmax":
        return vn
    return vn * jnp.exp(model._shift())


def cfl_dt(model: CircleDensity, cfl: float = 0.9):
    """The positivity step: dt (2 v_max/h + σ²/h²) = cfl (≤ 1), the fd diffusion's
    (largest eigenvalue 2σ²/h²). Spectral diffusion's largest eigenvalue is (σ²/2)(π/h)²:
    its term is (π²/4) σ²/h², which keeps Heun's stability limit |dt λ| ≤ 2 (with σ²/h² the
    default step blew up to NaN)."""
    h = model.h
    diff = model.sigma ** 2 / h ** 2 * (1.0 if model.diffusion == "fd" else math.pi ** 2 / 4)
    return cfl / (2 * velocity_bound(model) / h + diff)
