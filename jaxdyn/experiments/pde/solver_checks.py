"""The density solver's accuracy checks quoted by the density guide, measured and written as a result file.

Every check is deterministic (fixed seeds and grids), in float64 unless it says otherwise:

* ``example``: the mass drift that ``examples/density_solver.py`` prints, run as it is (float32)
  and with ``JAX_ENABLE_X64=1``;
* ``linear_rates``: the solver's rates (``pde.growth_rate``, a JVP) against λ_k for k = 1..10 at
  β = 1, 5, 20, 100, M = 1024, softmax and unnormalised;
* ``fourier_field``: ``pde.CircleAttention`` (O(N K)) against the dense field on random clouds of
  400 points (Q = K = V = I and random Q, K, V; softmax and unnormalised; β = 1, 5, 20), and the
  number of modes K at β = 5;
* ``fourier_rk4``: projected-RK4 trajectories of the two fields from 300 samples of
  (1 + 0.5 cos 3θ)/(2π) at β = 5 to t = 6, dt = 0.2, 0.1, 0.05;
* ``quantile_modes``: the quantile cloud's modes against the density's at N = 10⁴ (k = 1..16);
* ``grid_orders``: a cluster forming from e^{2 cos θ} at β = 5, L1 differences between grids M and
  2M (σ = 0, t = 2 and σ = 0.5, t = 3; M = 64 … 1024) and their observed orders;
* ``s2``: on S² at β = 5 the zonal rates l = 1..4 against λ_l on 16×32, 32×64, 64×128 cells, the
  positivity step and the wall-clock median of one right-hand side on 32×64 cells.

    python -m jaxdyn.experiments.pde.solver_checks --out docs/results/pde/pde_solver_checks.json
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
I2 = np.eye(2)


def _cell_averages(f, m, q=64):
    """Cell averages of f on the M cells centred at jh (Gauss–Legendre, q nodes a cell)."""
    x, w = np.polynomial.legendre.leggauss(q)
    h = 2 * math.pi / m
    c = np.arange(m) * h
    return sum(wi / 2 * f(c + xi * h / 2) for xi, wi in zip(x, w))


def example_drift(x64: bool) -> float:
    """The mass drift ``examples/density_solver.py`` prints (float32, or float64 with ``x64``).

    Returns:
      The printed drift.

    Raises:
      RuntimeError: the script failed or printed no drift.
    """
    env = dict(os.environ, MPLBACKEND="Agg")
    env.pop("JAX_ENABLE_X64", None)
    if x64:
        env["JAX_ENABLE_X64"] = "1"
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, "examples/density_solver.py", "--out", out], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=900)
    m = re.search(r"mass drift ([0-9.e+-]+)", p.stdout)
    if p.returncode or not m:
        raise RuntimeError(f"examples/density_solver.py failed:\n{p.stdout}\n{p.stderr}")
    return float(m.group(1))


def linear_rate_errors() -> dict:
    """The JVP rates against λ_k: the largest relative error and where it is."""
    from ... import pde

    ks = np.arange(1, 11)
    worst = {"rel_error": 0.0}
    for norm in ("softmax", "unnormalized"):
        for beta in (1.0, 5.0, 20.0, 100.0):
            model = pde.CircleDensity(I2, I2, I2, beta, 1024, normalization=norm)
            lam = pde.linear_rates(beta, ks, normalization=norm)
            err = np.abs(np.asarray(pde.growth_rate(model, ks)) / lam - 1)
            i = int(np.argmax(err))
            if err[i] > worst["rel_error"]:
                worst = {"rel_error": float(err[i]), "beta": beta, "normalization": norm,
                         "k": int(ks[i]), "lambda_k": float(lam[i])}
    return {"ks": [1, 10], "betas": [1.0, 5.0, 20.0, 100.0], "m": 1024, "worst": worst}


def fourier_field() -> dict:
    """The Fourier field against the dense one: the largest relative difference, and K at β = 5."""
    import jax.numpy as jnp

    from ... import SphereAttention, pde

    diffs = []
    for beta in (1.0, 5.0, 20.0):
        for general in (False, True):
            rng = np.random.default_rng(int(beta))
            th = rng.uniform(0, 2 * np.pi, 400)
            x = jnp.asarray(np.stack([np.cos(th), np.sin(th)], -1))
            Q, K, V = tuple(rng.normal(size=(3, 2, 2))) if general else (I2, I2, I2)
            for norm in ("softmax", "unnormalized"):
                f = pde.CircleAttention(Q, K, V, beta, normalization=norm)
                d = SphereAttention(jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), beta,
                                    kernel="dense", normalization=norm)
                a, b = np.asarray(f(0.0, x)), np.asarray(d(0.0, x))
                diffs.append(float(np.max(np.abs(a - b)) / np.max(np.abs(b))))
    return {"n": 400, "betas": [1.0, 5.0, 20.0], "max_rel_difference": max(diffs),
            "cases": len(diffs), "k_modes_beta5": int(pde.CircleAttention(I2, I2, I2, 5.0).n_modes)}


def fourier_rk4() -> dict:
    """Projected-RK4 trajectories of the Fourier and dense fields: max |difference| at t = 6 per dt."""
    import jax
    import jax.numpy as jnp

    from ... import SphereAttention, pde, simulate

    rho0 = (1 + 0.5 * np.asarray(pde.cos_mode(256, 3, jnp.float64))) / (2 * math.pi)
    x0 = jnp.asarray(pde.sample_density(jax.random.PRNGKey(0), rho0, 300))
    f = pde.CircleAttention(I2, I2, I2, 5.0)
    d = SphereAttention(I2, I2, I2, 5.0, kernel="dense")
    dts = [0.2, 0.1, 0.05]
    diffs = [float(jnp.max(jnp.abs(simulate(f, x0, t1=6.0, dt=dt, method="rk4").xs[-1]
                                   - simulate(d, x0, t1=6.0, dt=dt, method="rk4").xs[-1])))
             for dt in dts]
    return {"n": 300, "beta": 5.0, "t": 6.0, "dt": dts, "max_difference": diffs,
            "ratios": [diffs[i] / diffs[i + 1] for i in range(len(dts) - 1)]}


def quantile_modes() -> dict:
    """The quantile cloud's modes against the density's exact coefficients: largest relative error."""
    import jax

    from ... import pde

    m, n, ks = 512, 10_000, np.arange(1, 17)
    rho0 = pde.perturbed_uniform(m, 1e-8, jax.random.PRNGKey(0))
    exact = np.abs(np.fft.rfft(rho0)[ks]) * 2 * math.pi / m * np.sinc(ks / m)
    q = pde.empirical_modes(pde.quantile_points(rho0, n), ks)
    return {"m": m, "n": n, "ks": [1, 16], "max_rel_error": float(np.max(np.abs(q / exact - 1)))}


def grid_orders() -> dict:
    """Successive L1 differences between grids M and 2M of a forming cluster, and their orders."""
    from ... import pde

    def coarsen(r):
        return (0.5 * np.roll(r, 1)[::2] + r[::2] + 0.5 * np.roll(r, -1)[::2]) / 2

    ms = [64, 128, 256, 512, 1024, 2048]
    out = {}
    for sigma, t1 in ((0.0, 2.0), (0.5, 3.0)):
        sols = {}
        for m in ms:
            r0 = _cell_averages(lambda th: np.exp(2 * np.cos(th)), m)
            r0 /= r0.sum() * 2 * math.pi / m
            model = pde.CircleDensity(I2, I2, I2, 5.0, m, sigma=sigma)
            sols[m] = np.asarray(pde.solve_density(model, r0, t1=t1, n_save=2).rho[-1])
        errs = [float(np.abs(coarsen(sols[2 * m]) - sols[m]).sum() * 2 * math.pi / m) for m in ms[:-1]]
        out[f"sigma={sigma:g}"] = {"t": t1, "m": ms[:-1], "l1_difference": errs,
                                   "orders": [float(x) for x in np.log2(np.array(errs[:-1]) / errs[1:])]}
    return out


def s2_checks() -> dict:
    """S²: zonal rates against λ_l per grid, the positivity step and one right-hand side's time."""
    import equinox as eqx
    import jax

    from ... import pde

    ls = np.arange(1, 5)
    lam = pde.sphere_rates(5.0, ls)
    grids = []
    for nl in (16, 32, 64):
        model = pde.SphereDensity(np.eye(3), np.eye(3), np.eye(3), 5.0, nl, 2 * nl)
        got = np.asarray(pde.zonal_growth_rate(model, ls))
        grids.append({"cells": [nl, 2 * nl], "max_rel_error": float(np.max(np.abs(got / lam - 1)))})
    model = pde.SphereDensity(np.eye(3), np.eye(3), np.eye(3), 5.0, 32, 64)
    r = np.ones((32, 64))
    r /= float((r * np.asarray(model.cell_measure)).sum())
    dt = float(pde.solve_density(model, r, t1=0.01, n_save=2).stats["dt"])
    rhs = eqx.filter_jit(lambda mod, rho: mod(0.0, rho))
    jax.block_until_ready(rhs(model, r))
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        jax.block_until_ready(rhs(model, r))
        times.append(time.perf_counter() - t0)
    return {"beta": 5.0, "ls": [1, 4], "grids": grids, "positivity_dt_32x64": dt,
            "rhs_seconds_32x64_median": float(np.median(times)), "rhs_repeats": len(times)}


def measure() -> dict:
    """Every check (module doc).

    Returns:
      The results of the result file, with each check's wall seconds.
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    out, seconds = {}, {}
    for name, fn in (("example", lambda: {"mass_drift_float32": example_drift(False),
                                          "mass_drift_float64": example_drift(True)}),
                     ("linear_rates", linear_rate_errors), ("fourier_field", fourier_field),
                     ("fourier_rk4", fourier_rk4), ("quantile_modes", quantile_modes),
                     ("grid_orders", grid_orders), ("s2", s2_checks)):
        t0 = time.perf_counter()
        out[name] = fn()
        seconds[name] = round(time.perf_counter() - t0, 1)
    out["check_wall_seconds"] = seconds
    return out


def main(argv=None) -> None:
    """Run the checks and write the result file."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    started = clock()
    res = measure()
    write_measurement(a.out, "pde", f"python -m jaxdyn.experiments.pde.solver_checks --out {a.out}",
                      res, started)


if __name__ == "__main__":
    main()
