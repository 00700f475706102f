"""The mean-field equation on S² on a latitude–longitude finite-volume grid.

Cells: colatitude edges ϑ_i = iπ/n_lat, longitude edges φ_j = 2πj/n_lon; unknowns the cell
averages ρ_ij; areas A_i = Δφ (cos ϑ_i − cos ϑ_{i+1}). The two kernel integrals

    N(x) = ∫ e^{β⟨Qx, Ky⟩} y ρ(y) dy,   D(x) = ∫ e^{β⟨Qx, Ky⟩} ρ(y) dy

are evaluated at the face midpoints by a dense (faces × cells) kernel matrix against ρ_ij A_i
(midpoint quadrature: second order), row-shifted by its max (a softmax): O(F·C) time and
memory a step, F ≈ 2C faces, C = n_lat·n_lon cells (C = 2048: 8.4 M entries, 67 MB in float64;
C = 8192: 134 M entries, 1 GB, which is where the dense path stops on a small machine)
(``kernel="dense"``). When B = QᵀK is invariant under rotations about the z axis
([[a, −b, 0], [b, a, 0], [0, 0, c]], e.g. Q = K = I) the logit depends on the longitude
difference only, and ``kernel="fft"`` (chosen by ``"auto"``) evaluates every pair of latitude
rows as a circular convolution by FFT in longitude: O(n_lat² n_lon) a quantity plus the FFTs,
with the kernel shifted by its global bound β(√(a²+b²) + |c|) instead of a per-row max (as on S¹;
|m| ≤ 1 is enforced).

Transport: normal velocity X·e_ϑ on ϑ-faces and X·e_φ on φ-faces, upwind flux with a MUSCL-MC
reconstruction in each direction (face values between neighbouring averages); the pole faces
have zero length, so no flux crosses the poles. Positivity step: dt · 2 v_max ΣL_f / A_i ≤ 1 for
every cell. Noise: the conservative two-point diffusive flux (σ²/2)(ρ_nb − ρ)/dist · L_f.
Mass is conserved to rounding (the fluxes telescope).

Linear stability (derived like docs/math.md §C.2 with the Funk–Hecke formula on S²): the zonal
harmonic P_l(cos ϑ) grows at λ_l = (l(l+1)/β) i_l(β)/i_0(β) − σ² l(l+1)/2, i_l the modified
spherical Bessel functions (i_l/i_0 = I_{l+1/2}/I_{1/2}). The grid is second order, so the
measured rates approach λ_l as h² (``tests/test_pde.py``).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_bounds, check_integer
from ..models._params import check_domain
from ._circle import BETA, SIGMA, check_temperature, check_weights, traced_positive

__all__ = ["SphereDensity", "sphere_rates", "zonal_mode", "zonal_growth_rate", "sphere_cfl_dt"]


def _mc(dm, dp):
    """The MC-limited slope from the one-sided differences."""
    same = dm * dp > 0
    mag = jnp.minimum(jnp.minimum(2 * jnp.abs(dm), 2 * jnp.abs(dp)), jnp.abs(dm + dp) / 2)
    return jnp.where(same, jnp.sign(dm) * mag, 0.0)


def _is_axial(B, rtol):
    """B (NumPy, on the host) of the form [[a, −b, 0], [b, a, 0], [0, 0, c]] to ``rtol``."""
    off = (abs(B[0, 0] - B[1, 1]) + abs(B[0, 1] + B[1, 0]) + np.abs(B[:2, 2]).sum()
           + np.abs(B[2, :2]).sum())
    return off <= rtol * (np.abs(B).max() + 1e-300)


def _host_geometry(n_lat, n_lon):
    """Colatitude edges (n_lat + 1,) and cell areas (n_lat,) in NumPy float64 (static sizes)."""
    te = np.arange(n_lat + 1) * (math.pi / n_lat)
    return te, (2 * math.pi / n_lon) * (np.cos(te[:-1]) - np.cos(te[1:]))


class SphereDensity(eqx.Module):
    """Right-hand side of the mean-field equation on S² for the cell averages ρ (n_lat, n_lon).

    A vector field ``field(t, rho, args) -> dρ/dt`` (a ``diffrax.ODETerm``): the finite-volume
    discretisation of ∂_t ρ + div(ρ X) = (σ²/2) Δρ, X(x) = P⊥(x) V m(x), m(x) the softmax mean of
    y under e^{β⟨Qx, Ky⟩} ρ(y) (module docstring). Building a model runs no device computation:
    concrete inputs are checked on the host.

    Args:
      Q: (3, 3) query weights.
      K: (3, 3) key weights.
      V: (3, 3) value weights.
      beta: inverse temperature β > 0 (an array leaf).
      n_lat: number of colatitude cells (≥ 4, static).
      n_lon: number of longitude cells (≥ 8, static).
      sigma: noise σ ≥ 0 (an array leaf).
      normalization: ``"softmax"`` or ``"unnormalized"``.
      kernel: ``"dense"`` (any B, O(F·C) a step), ``"fft"`` (B invariant under rotations about
        the z axis, [[a, −b, 0], [b, a, 0], [0, 0, c]]: FFTs in longitude), or ``"auto"``:
        ``"fft"`` when concrete Q, K give such a B (to 1e-12 relative), else ``"dense"``
        (traced Q or K: ``"dense"``, the kernel that is right for every value they can take).
      dtype: the floating dtype of the leaves (default: Q's, else JAX's default float).

    Attributes:
      Q, K, V, beta, sigma: the array leaves.
      n_lat, n_lon, normalization, kernel: static settings (``kernel`` resolved).

    Raises:
      ValueError: a weight not 3 × 3, a concrete Q or K not finite, β or σ not a scalar, a concrete β
        not finite and > 0 or σ not finite and ≥ 0, ``n_lat``/``n_lon`` not integers ≥ 4/≥ 8,
        an unknown option, or ``kernel="fft"`` with a concrete B that is not axial.
    """

    Q: jax.Array
    K: jax.Array
    V: jax.Array
    beta: jax.Array
    sigma: jax.Array
    n_lat: int = eqx.field(static=True)
    n_lon: int = eqx.field(static=True)
    normalization: str = eqx.field(static=True, default="softmax")
    kernel: str = eqx.field(static=True, default="dense")

    def __init__(self, Q, K, V, beta, n_lat, n_lon, *, sigma=0.0, normalization="softmax",
                 kernel="auto", dtype=None):
        Q, K, V, dtype, (hq, hk, _) = check_weights(Q, K, V, 3, dtype, "on S²")
        n_lat = check_integer("n_lat (colatitude cells)", n_lat, minimum=4, integral_floats=True)
        n_lon = check_integer("n_lon (longitude cells)", n_lon, minimum=8, integral_floats=True)
        if normalization not in ("softmax", "unnormalized"):
            raise ValueError(f"normalization must be 'softmax' or 'unnormalized', got {normalization!r}")
        if kernel not in ("auto", "dense", "fft"):
            raise ValueError(f"kernel must be 'auto', 'dense' or 'fft', got {kernel!r}")
        self.Q, self.K, self.V = Q, K, V
        self.beta, self.sigma, _ = check_temperature(beta, sigma, dtype)
        self.n_lat, self.n_lon = int(n_lat), int(n_lon)
        self.normalization = normalization
        B = None if hq is None or hk is None else hq.T @ hk  # on the host, in the model's dtype
        if kernel == "fft" and B is not None and not _is_axial(B, 1e-12):
            raise ValueError("kernel='fft' needs B = QᵀK invariant under rotations about the "
                             "z axis ([[a, −b, 0], [b, a, 0], [0, 0, c]]); use kernel='dense'")
        if kernel == "auto":
            kernel = "fft" if B is not None and _is_axial(B, 1e-12) else "dense"
        self.kernel = kernel

    @property
    def shape(self):
        """The shape (n_lat, n_lon) of the cell averages."""
        return (self.n_lat, self.n_lon)

    def geometry(self, dtype=None):
        """The grid: spacings, colatitude/longitude edges and centres, cell areas.

        Args:
          dtype: the floating dtype of the arrays (default: β's).

        Returns:
          dict with ``dth``, ``dph`` (floats), ``te`` (n_lat + 1,), ``tc`` (n_lat,), ``pc``,
          ``pe`` (n_lon,), ``area`` (n_lat,).
        """
        dtype = dtype or self.beta.dtype
        dth, dph = math.pi / self.n_lat, 2 * math.pi / self.n_lon
        te = jnp.arange(self.n_lat + 1, dtype=dtype) * dth
        tc = (jnp.arange(self.n_lat, dtype=dtype) + 0.5) * dth
        pc = (jnp.arange(self.n_lon, dtype=dtype) + 0.5) * dph
        pe = jnp.arange(self.n_lon, dtype=dtype) * dph  # φ-face j at the west edge of cell j
        area = dph * (jnp.cos(te[:-1]) - jnp.cos(te[1:]))
        return dict(dth=dth, dph=dph, te=te, tc=tc, pc=pc, pe=pe, area=area)

    @property
    def cell_measure(self):
        """The cell areas A_i as an (n_lat, 1) array (mass = Σ A_i ρ_ij)."""
        return self.geometry()["area"][:, None]

    @staticmethod
    def _xyz(t, p):
        return jnp.stack([jnp.sin(t) * jnp.cos(p), jnp.sin(t) * jnp.sin(p), jnp.cos(t) * jnp.ones_like(p)], -1)

    def _field(self, pts, y, w):
        """X(x) = P⊥(x) V m(x) (softmax) at points (F, 3) from cells y (C, 3), weights w (C,)."""
        B = self.Q.T @ self.K
        logits = self.beta * (pts @ B @ y.T)
        rowmax = jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))  # cancels
        k = jnp.exp(logits - rowmax)
        num = jnp.matmul(k, y * w[:, None], precision="highest")
        den = jnp.matmul(k, w, precision="highest")[:, None]
        if self.normalization == "softmax":
            mvec = num / jnp.maximum(den, jnp.finfo(pts.dtype).tiny)
        else:
            mvec = num * jnp.exp(rowmax)
        X = mvec @ self.V.T
        return X - jnp.sum(X * pts, -1, keepdims=True) * pts

    def _field_fft(self, rho, g, t_rows, offset):
        """X at points (t_rows[i], pc_j + offset) by FFTs in longitude.

        For B axial the logit β[sinϑ sinϑ' (a cos Δφ + b sin Δφ) + c cosϑ cosϑ'] depends on Δφ
        only, so every pair of latitude rows is a circular convolution: O(n_lat² n_lon) a
        quantity instead of O(n_lat² n_lon²).

        Returns:
          (len(t_rows) · n_lon, 3) tangent field.
        """
        B = self.Q.T @ self.K
        a, b, c = (B[0, 0] + B[1, 1]) / 2, (B[1, 0] - B[0, 1]) / 2, B[2, 2]
        # the maximum of the logit over two unit vectors (a larger bound such as
        # β(√(a²+b²) + |c|), 2β for B = I, puts kernel values below e^{−β}: a zero field in
        # float32 from β ≈ 90); no derivative through it (it cancels in the softmax ratio and
        # against the e^{shift} of the unnormalised field)
        shift = jax.lax.stop_gradient(self.beta * jnp.maximum(jnp.sqrt(a * a + b * b), jnp.abs(c)))
        dm = jnp.arange(self.n_lon, dtype=rho.dtype) * g["dph"] + offset
        st, ct = jnp.sin(t_rows)[:, None, None], jnp.cos(t_rows)[:, None, None]
        ss, cs = jnp.sin(g["tc"])[None, :, None], jnp.cos(g["tc"])[None, :, None]
        kern = jnp.exp(self.beta * (st * ss * (a * jnp.cos(dm) + b * jnp.sin(dm)) + c * ct * cs) - shift)
        khat = jnp.fft.fft(kern, axis=-1)                                   # (T, S, n_lon)
        w = rho * g["area"][:, None]
        pc = g["pc"][None, :]
        qs = [w * jnp.sin(g["tc"])[:, None] * jnp.exp(1j * pc), w * jnp.cos(g["tc"])[:, None], w]
        outs = [jnp.fft.ifft(jnp.einsum("tsm,sm->tm", khat, jnp.fft.fft(q, axis=-1)), axis=-1) for q in qs]
        nxy, nz, d = outs[0], jnp.real(outs[1]), jnp.real(outs[2])
        num = jnp.stack([jnp.real(nxy), jnp.imag(nxy), nz], -1)
        if self.normalization == "softmax":
            mvec = num / jnp.maximum(d, jnp.finfo(rho.dtype).tiny)[..., None]
            r = jnp.linalg.norm(mvec, axis=-1, keepdims=True)
            mvec = jnp.where(r > 1, mvec / jnp.maximum(r, 1), mvec) * (d > 0)[..., None]
        else:
            mvec = num * jnp.exp(shift)
        T, P = jnp.meshgrid(t_rows, g["pc"] + offset, indexing="ij")
        pts = self._xyz(T, P)
        X = mvec @ self.V.T
        return (X - jnp.sum(X * pts, -1, keepdims=True) * pts).reshape(-1, 3)

    def __call__(self, t, rho, args=None):
        """The right-hand side dρ/dt = −div(flux)/A_i on every cell.

        Args:
          t: time (unused: the field is autonomous).
          rho: (n_lat, n_lon) cell averages.
          args: unused (diffrax's signature).

        Returns:
          (n_lat, n_lon) time derivatives of the cell averages.
        """
        g = self.geometry(rho.dtype)
        nl, nn = self.n_lat, self.n_lon
        T, P = jnp.meshgrid(g["tc"], g["pc"], indexing="ij")
        y = self._xyz(T, P).reshape(-1, 3)
        w = (rho * g["area"][:, None]).reshape(-1)
        # ϑ-faces: interior edges te[1:-1] at cell-centre longitudes; φ-faces at (tc, pe)
        Tt, Pt = jnp.meshgrid(g["te"][1:-1], g["pc"], indexing="ij")
        Tp, Pp = jnp.meshgrid(g["tc"], g["pe"], indexing="ij")
        xt, xp = self._xyz(Tt, Pt).reshape(-1, 3), self._xyz(Tp, Pp).reshape(-1, 3)
        if self.kernel == "fft":
            Xt = self._field_fft(rho, g, g["te"][1:-1], 0.0)
            Xp = self._field_fft(rho, g, g["tc"], -g["dph"] / 2)
        else:
            X = self._field(jnp.concatenate([xt, xp]), y, w)
            Xt, Xp = X[: xt.shape[0]], X[xt.shape[0]:]
        e_t = jnp.stack([jnp.cos(Tt) * jnp.cos(Pt), jnp.cos(Tt) * jnp.sin(Pt), -jnp.sin(Tt)], -1).reshape(-1, 3)
        e_p = jnp.stack([-jnp.sin(Pp), jnp.cos(Pp), jnp.zeros_like(Pp)], -1).reshape(-1, 3)
        vt = jnp.sum(Xt * e_t, -1).reshape(nl - 1, nn)   # southward velocity at ϑ-faces
        vp = jnp.sum(Xp * e_p, -1).reshape(nl, nn)       # eastward velocity at φ-faces
        # ϑ-direction MUSCL (no wrap: one-sided at the poles, slope 0 in the pole rows)
        pad = jnp.concatenate([rho[:1], rho, rho[-1:]], 0)
        st = _mc(pad[1:-1] - pad[:-2], pad[2:] - pad[1:-1])
        north_state = (rho + st / 2)[:-1]   # from cell i at its south face (edge i+1)
        south_state = (rho - st / 2)[1:]    # from cell i+1 at the same face
        Lt = g["dph"] * jnp.sin(g["te"][1:-1])[:, None]
        dist_t = g["dth"]
        Ft = (jnp.maximum(vt, 0) * north_state + jnp.minimum(vt, 0) * south_state
              - 0.5 * self.sigma ** 2 * (rho[1:] - rho[:-1]) / dist_t) * Lt
        # φ-direction MUSCL (periodic); face j is the west face of cell j
        sp = _mc(rho - jnp.roll(rho, 1, 1), jnp.roll(rho, -1, 1) - rho)
        west = jnp.roll(rho + sp / 2, 1, 1)   # cell j−1's east value
        east = rho - sp / 2                   # cell j's west value
        dist_p = jnp.sin(g["tc"])[:, None] * g["dph"]
        Fp = (jnp.maximum(vp, 0) * west + jnp.minimum(vp, 0) * east
              - 0.5 * self.sigma ** 2 * (rho - jnp.roll(rho, 1, 1)) / dist_p) * g["dth"]
        zero = jnp.zeros((1, nn), rho.dtype)
        Ft_full = jnp.concatenate([zero, Ft, zero], 0)  # edges 0..n_lat (poles: no flux)
        div = (Ft_full[1:] - Ft_full[:-1]) + (jnp.roll(Fp, -1, 1) - Fp)
        return -div / g["area"][:, None]


def _norm2(V):
    """‖V‖₂ (a singular value decomposition in the program: cusolver/TPU ops on accelerators)."""
    return jnp.linalg.norm(V, ord=2)


def sphere_cfl_dt(model: SphereDensity, cfl: float = 0.9):
    """The positivity step: dt (2 v_max ΣL_f + σ² Σ L_f/dist_f) / A_i ≤ cfl for every cell.

    Args:
      model: a :class:`SphereDensity`.
      cfl: the CFL number (≤ 1 keeps ρ ≥ 0 with Heun).

    Returns:
      A scalar array, the step (traceable; NaN for a traced cfl that is not > 0).

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses a concrete cfl that is
    not a finite number > 0.
    """
    check_bounds("cfl", cfl, low=0, low_open=True, what=" (the CFL number)")
    g = model.geometry()
    vmax = _norm2(model.V)
    if model.normalization != "softmax":
        B = model.Q.T @ model.K
        vmax = vmax * jnp.exp(model.beta * jnp.sqrt(jnp.sum(B * B)))
    Ltop = g["dph"] * jnp.sin(g["te"][:-1])
    Lbot = g["dph"] * jnp.sin(g["te"][1:])
    Lside = 2 * g["dth"]
    dist_p = jnp.sin(g["tc"]) * g["dph"]
    rate = (2 * vmax * (Ltop + Lbot + Lside)
            + model.sigma ** 2 * ((Ltop + Lbot) / g["dth"] + Lside / dist_p)) / g["area"]
    return traced_positive(cfl) / jnp.max(rate)


def sphere_rates(beta, ls, sigma=0.0):
    """λ_l = (l(l+1)/β) i_l(β)/i_0(β) − σ² l(l+1)/2 (softmax, S², B = V = I).

    The closed form of the zonal growth rates, evaluated on the host with SciPy's Bessel
    functions (orders l + 1/2; JAX's have orders 0 and 1 only): concrete inputs.

    Args:
      beta: inverse temperature β > 0.
      ls: degrees l (array-like).
      sigma: noise σ ≥ 0.

    Returns:
      NumPy float64 array of the rates, the shape of ``ls``.

    A ValueError (the shared checks of :mod:`jaxdyn._checks`) refuses β not a finite number >
    0, σ not a finite number ≥ 0, or degrees that are not finite numbers ≥ 0.
    """
    from scipy.special import ive

    check_domain("beta", beta, BETA)
    check_domain("sigma", sigma, SIGMA)
    check_bounds("ls", ls, low=0, what=" (the degrees)")
    ls = np.asarray(ls, float)
    return ls * (ls + 1) / beta * ive(ls + 0.5, beta) / ive(0.5, beta) - sigma ** 2 * ls * (ls + 1) / 2


def zonal_mode(model: SphereDensity, l: int):
    """Cell averages of P_l(cos ϑ) (exact: ∫ P_l dx = (P_{l+1} − P_{l−1})/(2l+1)).

    Computed on the host from the grid sizes (static): also under ``jax.jit``.

    Args:
      model: a :class:`SphereDensity` (its grid and dtype).
      l: the degree (an integer ≥ 1).

    Returns:
      (n_lat, n_lon) cell averages in β's dtype.
    """
    from scipy.special import eval_legendre

    te, area = _host_geometry(model.n_lat, model.n_lon)
    ce = np.cos(te)
    integ = (eval_legendre(l + 1, ce) - eval_legendre(l - 1, ce)) / (2 * l + 1)  # antiderivative
    avg = (integ[:-1] - integ[1:]) * (2 * math.pi / model.n_lon) / area
    return jnp.asarray(np.repeat(avg[:, None], model.n_lon, 1), model.beta.dtype)


def zonal_growth_rate(model: SphereDensity, l):
    """The solver's growth rate of the zonal mode l of the uniform state.

    The JVP of the right-hand side at ρ = 1/(4π) on the cell averages of P_l, projected on them
    (area-weighted); compare with :func:`sphere_rates`. Traceable in the model (β, σ, weights).

    Args:
      model: a :class:`SphereDensity`.
      l: a degree (int), or a list of degrees (static).

    Returns:
      A scalar array, or one rate per degree.
    """
    ls = np.atleast_1d(l)
    cs = jnp.stack([zonal_mode(model, int(k)) for k in ls])
    rates = _projected_jvp(model, cs)
    return rates if np.ndim(l) else rates[0]


@eqx.filter_jit
def _projected_jvp(model, cs):
    """The JVP at the uniform state on each mode, projected on it."""
    u = jnp.full(model.shape, 1 / (4 * math.pi), model.beta.dtype)
    a = model.cell_measure
    jv = jax.vmap(lambda c: jax.jvp(lambda r: model(0.0, r), (u,), (c,))[1])(cs)
    return jnp.sum(jv * cs * a, axis=(1, 2)) / jnp.sum(cs * cs * a, axis=(1, 2))
