"""Paper A, Corollary 2 (β = ∞): the rate at which W2(ρ_t, Π#ρ0) decays, seed by seed.

The zero-temperature field (:class:`jaxdyn.ZeroTemperature`, float64) moves a uniform cloud x0
of N particles; W2 by exact assignment between the cloud at t and the cloud Π(x0), and the
median particle's angle to E, are fitted by a line in log scale over t ∈ [t_fit0, t_fit1]; their
decay rates are recorded per seed for the weights of a config (its ``weights`` and ``d``).

    python -m jaxdyn.experiments.concentration.corollary2 --config CONFIG [--config …] --out FILE
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def rates(config: str, seeds, n: int = 1024, t_fit=(3.0, 9.0), dt: float = 0.02,
          times: int = 13) -> dict:
    """The decay rates of W2 to Π#ρ0 and of the median angle to E, one per seed.

    Args:
      config: a concentration YAML config (its ``weights`` and ``d`` are used).
      seeds: the seeds of the uniform clouds.
      n: particles.
      t_fit: the fitted window.
      dt: the RK4 step.
      times: the evenly spaced times in the window at which W2 is measured.

    Returns:
      ``{"config", "d", "gap", "n", "t_fit", "seed", "w2_rate", "angle_rate", "w2": [seed][time],
      "t"}``.

    Raises:
      RuntimeError: the integration did not save the requested times.
    """
    import jax

    from ... import ZeroTemperature, check_assumptions, projection, simulate
    from ...config import parse_yaml
    from ...distances import w2_exact
    from .. import sphere_fields as sf
    from ..planning import resolve_config

    with open(config) as f:
        cfg = resolve_config(parse_yaml(f.read(), config))
    d = cfg["d"]
    Q, K, V = sf.build_weights(cfg["weights"], d)
    ts = np.linspace(t_fit[0], t_fit[1], times)
    out = {"config": config, "d": d, "n": n, "t_fit": list(t_fit), "t": ts.tolist(), "dt": dt,
           "gap": float(check_assumptions(Q, K, V).gap), "seed": [], "w2_rate": [], "angle_rate": [],
           "w2": [], "median_angle": []}
    with jax.enable_x64(True):
        pi = projection(Q, K, V)
        P = np.asarray(pi.basis, float)
        model = ZeroTemperature(Q, K, V)
        for s in seeds:
            x0 = np.random.default_rng([int(s), 0xC2]).standard_normal((n, d))
            x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
            target = np.asarray(pi(x0))
            traj = simulate(model, x0, t1=float(ts[-1]), dt=dt, method="rk4", saveat=ts)
            tt = np.asarray(traj.ts)
            xs = np.asarray(traj.xs)
            keep = [int(np.argmin(np.abs(tt - t))) for t in ts]
            if not np.allclose(tt[keep], ts, atol=dt / 2):
                raise RuntimeError(f"saved times {tt[keep]} are not the requested {ts}")
            w2 = [float(w2_exact(xs[k], target).value) for k in keep]
            proj = np.linalg.norm(xs[keep] @ P, axis=-1)       # |P_E x| = cos(angle to E)
            ang = np.median(np.arccos(np.clip(proj, -1.0, 1.0)), axis=-1)
            out["seed"].append(int(s))
            out["w2"].append(w2)
            out["median_angle"].append(ang.tolist())
            out["w2_rate"].append(-float(np.polyfit(ts, np.log(w2), 1)[0]))
            out["angle_rate"].append(-float(np.polyfit(ts, np.log(ang), 1)[0]))
    return out


def main(argv=None) -> None:
    """Measure the rates for each config and write a result file."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", required=True)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    started = clock()
    res = {}
    for c in a.config:
        name = c.rsplit("/", 1)[-1].removesuffix(".yaml")
        res[name] = rates(c, range(a.seeds), n=a.n)
    cmd = ("python -m jaxdyn.experiments.concentration.corollary2 "
           + " ".join(f"--config {c}" for c in a.config) + f" --seeds {a.seeds} --n {a.n} --out {a.out}")
    write_measurement(a.out, "corollary_2", cmd, res, started)


if __name__ == "__main__":
    main()
