"""The closed covariance right-hand sides against particles, over many draws.

``jaxdyn.gaussian.covariance_rhs`` gives Ṡ = M S + S Mᵀ of two-head softmax, L2 and Sinkhorn
attention on N(0, S) in closed form. A cloud of N particles with exactly the moments of N(0, S)
(``gaussian_cloud(..., exact_moments=True)``) gives the same Ṡ up to the cloud's higher moments,
a Monte Carlo error that moves with the draw and shrinks with N. This measures the relative
error ``‖Ṡ_particles − Ṡ_closed‖_F / ‖Ṡ_closed‖_F`` for each attention over ``--seeds`` draws at
each N, with the weights, β = 0.3 and S of ``tests/test_variants_attention.py``.

``--ode`` measures the integrated moment ODE instead: ``jaxdyn.solve_moments(attention=...)``
(two heads, A, b and m ≠ 0) against a cloud with the exact initial moments carried to t = 1 by
``jaxdyn.simulate`` with the Euclidean field (blocked kernel, RK4), the comparison of
``test_solve_moments_attention_against_particles_large`` with its N, steps and Sinkhorn sweeps
(:data:`ODE_CASES`), over the clouds of NumPy seeds 1 .. ``--seeds`` (seed 1 is the test's). The
error of Σ(1) relative to its change, ``‖Σ_particles − Σ_ode‖_F / ‖Σ_ode − Σ(0)‖_F``, and the
same for the mean.

    python -m jaxdyn.experiments.variants.covariance_check --seeds 20 --n 1000,4000 --out FILE.json
    python -m jaxdyn.experiments.variants.covariance_check --ode --seeds 5 --out FILE.json
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from ...models import AbstractParticleModel, MultiHeadAttention

#: the covariance, inverse temperature and Sinkhorn sweeps of the check
S = np.array([[1.0, 0.3], [0.3, 0.6]])
BETA = 0.3
SINKHORN_ITERS = 40
ATTENTIONS = ("softmax", "l2", "sinkhorn")


def weights(seed: int = 0):
    """Two heads' (Q, K, V) in d = 2, drawn as the test draws them."""
    r = np.random.default_rng(seed)
    Q, K = r.normal(size=(2, 2, 2, 2)) * 0.7
    V = r.normal(size=(2, 2, 2))
    return Q, K, V


def relative_errors(n: int, seeds) -> dict:
    """The relative error of the particles' Ṡ for each attention and draw.

    Args:
      n: particles a cloud.
      seeds: the clouds' seeds.

    Returns:
      attention → list of relative errors, one a seed.

    Raises:
      ValueError: n < 3 (a cloud with the exact moments of a 2-d Gaussian needs 3 points).
    """
    import jax
    import jax.numpy as jnp

    from ...gaussian import covariance_rhs, gaussian_cloud
    from ...kernels import heads_interaction

    if n < 3:
        raise ValueError(f"n = {n}: at least 3 particles")
    with jax.enable_x64(True):
        Q, K, V = (jnp.asarray(a) for a in weights())

        @jax.jit
        def particle_rhs(x):
            q = jnp.einsum("hpd,nd->hnp", Q, x, precision="highest")
            k = jnp.einsum("hpd,nd->hnp", K, x, precision="highest")
            out = []
            for logits, iters in (("dot", 0), ("l2", 0), ("dot", SINKHORN_ITERS)):
                m = heads_interaction(q, k, x, BETA, kernel="dense", logits=logits,
                                      sinkhorn_iters=iters)
                u = jnp.einsum("hne,hde->nd", m, V, precision="highest")
                out.append((u.T @ x + x.T @ u) / x.shape[0])
            return out

        closed = {a: np.asarray(covariance_rhs(jnp.asarray(S), Q, K, V, BETA, attention=a))
                  for a in ATTENTIONS}
        errs: dict = {a: [] for a in ATTENTIONS}
        for s in seeds:
            x = gaussian_cloud(jax.random.PRNGKey(int(s)), n, jnp.zeros(2), jnp.asarray(S),
                               exact_moments=True)
            for a, got in zip(ATTENTIONS, particle_rhs(jnp.asarray(x))):
                want = closed[a]
                errs[a].append(float(np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want)))
    return errs


def measure(ns=(1000, 4000), seeds: int = 20) -> dict:
    """Mean, range and 5–95 % of the relative errors at each N (seeds 0 .. seeds − 1)."""
    out = {"beta": BETA, "S": S.tolist(), "sinkhorn_iters": SINKHORN_ITERS, "seeds": int(seeds),
           "by_n": {}}
    for n in ns:
        errs = relative_errors(int(n), range(seeds))
        out["by_n"][str(int(n))] = {
            a: {"mean": float(np.mean(e)), "min": float(np.min(e)), "max": float(np.max(e)),
                "p05": float(np.quantile(e, 0.05)), "p95": float(np.quantile(e, 0.95)),
                "values": e} for a, e in errs.items()}
    return out


#: attention → (particles, Sinkhorn sweeps, RK4 step) of the moment-ODE comparison
ODE_CASES = {"softmax": (8000, 0, 0.05), "l2": (8000, 0, 0.05), "sinkhorn": (1000, 20, 0.1)}
#: the initial mean and the drift's offset b of the moment problem
ODE_M0, ODE_B = (0.3, -0.2), (0.1, 0.0)


def moment_problem(seed: int = 0):
    """Two heads' (Q, K, V) and the affine part A in d = 2, drawn as the test draws them."""
    r = np.random.default_rng(seed)
    Q, K = r.normal(size=(2, 2, 2, 2)) * 0.7
    V = r.normal(size=(2, 2, 2)) * 0.5
    A = r.normal(size=(2, 2)) * 0.2
    return Q, K, V, A


class AffineAttentionField(AbstractParticleModel):
    """The particle field ẋ = A x + b + Σ_h V_h Σ_j w^h_ij x_j.

    A multi-head attention's Euclidean field (its ``ambient`` part, no sphere projection) plus
    an affine part: the particles whose moments ``solve_moments(attention=...)`` follows.
    """

    inner: MultiHeadAttention
    A: jax.Array
    b: jax.Array

    @property
    def dim(self):
        """The space's dimension (the attention's)."""
        return self.inner.dim

    def __call__(self, t, x, args=None):
        """The velocities of the particles x (N, d) at time t."""
        return self.inner.ambient(t, x) + x @ self.A.T + self.b


def ode_errors(attention: str, n: int, sweeps: int, dt: float, seeds) -> dict:
    """Σ(1) and m(1) of N particles against ``solve_moments``, one cloud a seed.

    Args:
      attention: "softmax", "l2" or "sinkhorn".
      n: particles.
      sweeps: Sinkhorn sweeps of the particles' weights (at least 1 is passed).
      dt: the RK4 step.
      seeds: NumPy seeds of the clouds.

    Returns:
      {"cov": [...], "mean": [...]}: the relative errors, one a seed.

    Raises:
      RuntimeError: ``solve_moments`` did not reach t = 1.
    """
    import jax
    import jax.numpy as jnp

    import jaxdyn as jd

    from ...gaussian import gaussian_cloud, solve_moments

    with jax.enable_x64(True):
        Q, K, V, A = (jnp.asarray(a) for a in moment_problem())
        m0, b, S0 = jnp.asarray(ODE_M0), jnp.asarray(ODE_B), jnp.asarray(S)
        sol = solve_moments(m0, S0, A=A, V=V, b=b, t1=1.0, attention=attention, Q=Q, K=K,
                            beta=BETA)
        if not bool(sol.ok):
            raise RuntimeError(f"solve_moments(attention={attention!r}) failed")
        mh = jd.MultiHeadAttention(Q, K, V, BETA, attention=attention,
                                   sinkhorn_iters=max(sweeps, 1), kernel="blocked")
        field = AffineAttentionField(mh, A, b)
        out: dict = {"cov": [], "mean": []}
        for s in seeds:
            x0 = jnp.asarray(gaussian_cloud(int(s), n, m0, S0, exact_moments=True))
            x = jd.simulate(field, x0, t1=1.0, dt=dt, method="rk4", save_every=10**6).xs[-1]
            mp = jnp.mean(x, 0)
            Sp = (x - mp).T @ (x - mp) / n
            out["cov"].append(float(jnp.linalg.norm(Sp - sol.cov_final)
                                    / jnp.linalg.norm(sol.cov_final - S0)))
            out["mean"].append(float(jnp.linalg.norm(mp - sol.mean_final)
                                     / jnp.linalg.norm(sol.mean_final - m0)))
    return out


def measure_ode(seeds: int = 5) -> dict:
    """Mean and range of the moment ODE's errors for each attention (seeds 1 .. seeds)."""
    out = {"beta": BETA, "S": S.tolist(), "m0": list(ODE_M0), "b": list(ODE_B),
           "seeds": list(range(1, seeds + 1)), "t1": 1.0, "kernel": "blocked",
           "method": "rk4", "by_attention": {}}
    for a, (n, sweeps, dt) in ODE_CASES.items():
        e = ode_errors(a, n, sweeps, dt, range(1, seeds + 1))
        out["by_attention"][a] = {
            "n": n, "sinkhorn_iters": sweeps, "dt": dt,
            **{k: {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v)),
                   "values": v} for k, v in e.items()}}
    return out


def main(argv=None) -> None:
    """Measure and write the result file (``guide_numbers.write_measurement``)."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="draws at each N")
    p.add_argument("--n", default="1000,4000", help="comma-separated particle counts")
    p.add_argument("--ode", action="store_true",
                   help="the moment ODE against simulate (N of ODE_CASES; --n not used)")
    p.add_argument("--out", required=True, help="the result file (.json)")
    a = p.parse_args(argv)
    if a.seeds < 2:
        p.error(f"--seeds {a.seeds}: at least 2 draws (a spread)")
    started = clock()
    if a.ode:
        res = measure_ode(a.seeds)
        cmd = (f"python -m jaxdyn.experiments.variants.covariance_check --ode --seeds {a.seeds} "
               f"--out {a.out}")
        write_measurement(a.out, "covariance_ode", cmd, res, started)
        return
    res = measure(tuple(int(v) for v in a.n.split(",")), a.seeds)
    cmd = f"python -m jaxdyn.experiments.variants.covariance_check --seeds {a.seeds} --n {a.n} --out {a.out}"
    write_measurement(a.out, "covariance_particles", cmd, res, started)


if __name__ == "__main__":
    main()
