"""Speed of the density solver against particles on S¹.

One Heun step of the density at M cells (two right-hand sides: three FFT convolutions of length
M each, plus the flux) against one projected-RK4 particle step (four field evaluations) at N
particles: the O(N K) Fourier field ``jaxdyn.pde.CircleAttention`` and ``jaxdyn.SphereAttention``
(O(N²), blocked from N = 1024), β = 5, Q = K = V = I, float64. Wall time (median) and the
process CPU time per call. Writes benchmarks/runs/pde_speed.json.

    python benchmarks/bench_pde.py [--m 4096] [--n-fourier 1000 10000 100000] [--n-dense 1000 10000]
"""

from __future__ import annotations

import argparse

from common import add_common_args, machine_info, setup, time_call, write_json

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
add_common_args(parser)
parser.add_argument("--m", type=int, default=4096)
parser.add_argument("--beta", type=float, default=5.0)
parser.add_argument("--n-fourier", type=int, nargs="+", default=[1000, 10000, 100000])
parser.add_argument("--n-dense", type=int, nargs="+", default=[1000, 10000])
args = setup(parser)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxdyn  # noqa: E402
from jaxdyn import pde  # noqa: E402

if args.tiny:
    args.m, args.n_fourier, args.n_dense, args.reps = 64, [100], [100], 1
reps = args.reps or 5
I2 = np.eye(2)
out = {"machine": machine_info(), "beta": args.beta, "m": args.m, "density": {}, "particles": []}

model = pde.CircleDensity(I2, I2, I2, args.beta, args.m)
rho = jnp.asarray(pde.uniform_density(args.m, jnp.float64)) * (1 + 0.5 * pde.cos_mode(args.m, 3, jnp.float64))
rhs = jax.jit(lambda r: model(0.0, r))
stats, _ = time_call(rhs, rho, reps=max(reps, 20))
out["density"] = {"rhs": stats, "heun_step_s": 2 * stats["median_s"], "heun_step_cpu_s": 2 * stats["cpu_median_s"]}
print(f"density M = {args.m}: Heun step {2 * stats['median_s'] * 1e3:.3f} ms "
      f"(cpu {2 * stats['cpu_median_s'] * 1e3:.3f} ms)")

rng = np.random.default_rng(0)
for kind, ns in (("fourier", args.n_fourier), ("dense_or_blocked", args.n_dense)):
    for n in ns:
        th = rng.uniform(0, 2 * np.pi, n)
        x = jnp.asarray(np.stack([np.cos(th), np.sin(th)], -1))
        field = (pde.CircleAttention(I2, I2, I2, args.beta) if kind == "fourier"
                 else jaxdyn.SphereAttention(jnp.asarray(I2), jnp.asarray(I2), jnp.asarray(I2), args.beta))
        f = jax.jit(lambda y, field=field: field(0.0, y))
        stats, _ = time_call(f, x, reps=reps, max_seconds=30)
        row = {"kind": kind, "n": n, "field": stats, "rk4_step_s": 4 * stats["median_s"],
               "rk4_step_cpu_s": 4 * stats["cpu_median_s"]}
        if kind == "fourier":
            row["n_modes"] = field.n_modes
        out["particles"].append(row)
        print(f"{kind:17s} N = {n:>7d}: RK4 step {4 * stats['median_s'] * 1e3:9.3f} ms "
              f"(cpu {4 * stats['cpu_median_s'] * 1e3:9.3f} ms)")
write_json("pde_speed" + args.tag, out)
