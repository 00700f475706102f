"""The closed covariance right-hand sides against particles, over many draws.

``jaxdyn.gaussian.covariance_rhs`` gives Ṡ = M S + S Mᵀ of two-head softmax, L2 and Sinkhorn
attention on N(0, S) in closed form. A cloud of N particles with exactly the moments of N(0, S)
(``gaussian_cloud(..., exact_moments=True)``) gives the same Ṡ up to the cloud's higher moments,
a Monte Carlo error that moves with the draw and shrinks with N. This measures the relative
error ``‖Ṡ_particles − Ṡ_closed‖_F / ‖Ṡ_closed‖_F`` for each attention over ``--seeds`` draws at
each N, with the weights, β = 0.3 and S of ``tests/test_variants_attention.py``.

    python -m jaxdyn.experiments.variants.covariance_check --seeds 20 --n 1000,4000 --out FILE.json
"""

from __future__ import annotations

import argparse

import numpy as np

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


def main(argv=None) -> None:
    """Measure and write the result file (``guide_numbers.write_measurement``)."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="draws at each N")
    p.add_argument("--n", default="1000,4000", help="comma-separated particle counts")
    p.add_argument("--out", required=True, help="the result file (.json)")
    a = p.parse_args(argv)
    if a.seeds < 2:
        p.error(f"--seeds {a.seeds}: at least 2 draws (a spread)")
    started = clock()
    res = measure(tuple(int(v) for v in a.n.split(",")), a.seeds)
    cmd = f"python -m jaxdyn.experiments.variants.covariance_check --seeds {a.seeds} --n {a.n} --out {a.out}"
    write_measurement(a.out, "covariance_particles", cmd, res, started)


if __name__ == "__main__":
    main()
