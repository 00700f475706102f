"""The mean-field equation on S² on a latitude–longitude finite-volume grid (a first version).

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

from ._circle import check_weights, spectral_norm

__all__ = ["SphereDensity", "sphere_rates", "zonal_mode", "zonal_growth_rate", "sphere_cfl_dt"]


def _mc(dm, dp):
    same = dm * dp > 0
    mag = jnp.minimum(jnp.minimum(2 * jnp.abs(dm), 2 * jnp.abs(dp)), jnp.abs(dm + dp) / 2)
    return jnp.where(same, jnp.sign(dm) * mag, 0.0)


class SphereDensity(eqx.Module):
    """Right-hand side of the mean-field equation on S² for the cell averages ρ (n_lat, n_lon).

    Args: Q, K, V (3, 3); beta > 0; sigma ≥ 0; n_lat, n_lon grid sizes (static);
    normalization ``"softmax"`` or ``"unnormalized"``.
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
        Q, K, V, dtype = check_weights(Q, K, V, 3, dtype, "on S²")
        if n_lat < 4 or n_lon < 8:
            raise ValueError(f"grid too small: n_lat >= 4 and n_lon >= 8 needed, got {n_lat}, {n_lon}")
        if normalization not in ("softmax", "unnormalized"):
            raise ValueError(f"normalization must be 'softmax' or 'unnormalized', got {normalization!r}")
        self.Q, self.K, self.V = Q, K, V
        self.beta = jnp.asarray(beta, dtype)
        self.sigma = jnp.asarray(sigma, dtype)
        if not isinstance(self.beta, jax.core.Tracer) and not bool(self.beta > 0):
            raise ValueError(f"beta (inverse temperature) must be > 0, got {float(self.beta)}")
        if not isinstance(self.sigma, jax.core.Tracer) and not bool(self.sigma >= 0):
            raise ValueError(f"sigma (noise) must be >= 0, got {float(self.sigma)}")
        self.n_lat, self.n_lon = int(n_lat), int(n_lon)
        self.normalization = normalization
        if kernel not in ("auto", "dense", "fft"):
            raise ValueError(f"kernel must be 'auto', 'dense' or 'fft', got {kernel!r}")
        if kernel != "dense" and not isinstance(Q, jax.core.Tracer):
            Bn = np.asarray(Q).T @ np.asarray(K)
            axial = (abs(Bn[0, 0] - Bn[1, 1]) + abs(Bn[0, 1] + Bn[1, 0]) + np.abs(Bn[:2, 2]).sum()
                     + np.abs(Bn[2, :2]).sum()) <= 1e-12 * (np.abs(Bn).max() + 1e-300)
            if kernel == "fft" and not axial:
                raise ValueError("kernel='fft' needs B = QᵀK invariant under rotations about the "
                                 "z axis ([[a, −b, 0], [b, a, 0], [0, 0, c]]); use kernel='dense'")
            kernel = "fft" if axial else "dense"
        elif kernel == "auto":
            raise ValueError("kernel='auto' needs concrete Q, K; pass kernel='fft' or 'dense'")
        self.kernel = kernel

    @property
    def shape(self):
        return (self.n_lat, self.n_lon)

    def geometry(self, dtype=None):
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
        return self.geometry()["area"][:, None]

    @staticmethod
    def _xyz(t, p):
        return jnp.stack([jnp.sin(t) * jnp.cos(p), jnp.sin(t) * jnp.sin(p), jnp.cos(t) * jnp.ones_like(p)], -1)

    def _field(self, pts, y, w):
        """X(x) = P⊥(x) V m(x) (softmax) at points (F, 3) from cells y (C, 3), weights w (C,)."""
        B = self.Q.T @ self.K
        logits = self.beta * (pts @ B @ y.T)
        rowmax = jnp.max(logits, axis=1, keepdims=True)
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
        """X at points (t_rows[i], pc_j + offset) by FFTs in longitude: for B axial the logit
        β[sinϑ sinϑ' (a cos Δφ + b sin Δφ) + c cosϑ cosϑ'] depends on Δφ only, so every pair of
        latitude rows is a circular convolution: O(n_lat² n_lon) a quantity instead of
        O(n_lat² n_lon²)."""
        B = self.Q.T @ self.K
        a, b, c = (B[0, 0] + B[1, 1]) / 2, (B[1, 0] - B[0, 1]) / 2, B[2, 2]
        # the maximum of the logit over two unit vectors (β(√(a²+b²) + |c|), used before, is
        # 2β for B = I: kernel values below e^{−β}, a zero field in float32 from β ≈ 90)
        shift = self.beta * jnp.maximum(jnp.sqrt(a * a + b * b), jnp.abs(c))
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


def sphere_cfl_dt(model: SphereDensity, cfl: float = 0.9):
    """Positivity step: dt (2 v_max ΣL_f + σ² Σ L_f/dist_f) / A_i ≤ cfl for every cell."""
    g = model.geometry()
    vmax = spectral_norm(model.V)
    if model.normalization != "softmax":
        B = model.Q.T @ model.K
        vmax = vmax * jnp.exp(model.beta * jnp.sqrt(jnp.sum(B * B)))
    Ltop = g["dph"] * jnp.sin(g["te"][:-1])
    Lbot = g["dph"] * jnp.sin(g["te"][1:])
    Lside = 2 * g["dth"]
    dist_p = jnp.sin(g["tc"]) * g["dph"]
    rate = (2 * vmax * (Ltop + Lbot + Lside)
            + model.sigma ** 2 * ((Ltop + Lbot) / g["dth"] + Lside / dist_p)) / g["area"]
    return cfl / jnp.max(rate)


def sphere_rates(beta, ls, sigma=0.0):
    """λ_l = (l(l+1)/β) i_l(β)/i_0(β) − σ² l(l+1)/2 (softmax, S², B = V = I)."""
    from scipy.special import ive

    ls = np.asarray(ls, float)
    return ls * (ls + 1) / beta * ive(ls + 0.5, beta) / ive(0.5, beta) - sigma ** 2 * ls * (ls + 1) / 2


def zonal_mode(model: SphereDensity, l: int):
    """Cell averages of P_l(cos ϑ) (exact: ∫ P_l dx = (P_{l+1} − P_{l−1})/(2l+1))."""
    from scipy.special import eval_legendre

    g = model.geometry(np.float64)
    ce = np.cos(np.asarray(g["te"]))
    integ = (eval_legendre(l + 1, ce) - eval_legendre(l - 1, ce)) / (2 * l + 1)  # antiderivative
    avg = (integ[:-1] - integ[1:]) * g["dph"] / np.asarray(g["area"])
    return jnp.asarray(np.repeat(avg[:, None], model.n_lon, 1), model.beta.dtype)


def zonal_growth_rate(model: SphereDensity, l):
    """Growth rate of the zonal mode l (an int, or a list: one rate each) of the uniform state:
    the JVP of the right-hand side on the cell averages of P_l, projected on them
    (area-weighted)."""
    ls = np.atleast_1d(l)
    cs = jnp.stack([zonal_mode(model, int(k)) for k in ls])
    rates = _projected_jvp(model, cs)
    return rates if np.ndim(l) else rates[0]


@eqx.filter_jit
def _projected_jvp(model, cs):
    u = jnp.full(model.shape, 1 / (4 * math.pi), model.beta.dtype)
    a = model.cell_measure
    jv = jax.vmap(lambda c: jax.jvp(lambda r: model(0.0, r), (u,), (c,))[1])(cs)
    return jnp.sum(jv * cs * a, axis=(1, 2)) / jnp.sum(cs * cs * a, axis=(1, 2))
