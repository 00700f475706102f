"""The density solver on S¹: ρ(θ, t) from a perturbed uniform density breaks into k* clusters.

Run: ``python examples/density_solver.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdyn import pde
from _common import out_dir, pyplot

out = out_dir(__doc__)
beta, m = 10.0, 256
I = jnp.eye(2)
# ∂_t ρ + ∂_θ(ρ X_β[ρ]) = 0 on M finite-volume cells (FFT kernel integrals, MUSCL fluxes)
model = pde.CircleDensity(I, I, I, beta, m)
rho0 = pde.perturbed_uniform(m, 1e-3, jax.random.PRNGKey(0))  # 1 + ε Σ_k cos(kθ + φ_k)
sol = pde.solve_density(model, rho0, t1=20.0, n_save=81)
assert sol.names == "successful"

k_star = pde.most_unstable_mode(beta)          # argmax_k k² I_k(β)/I_0(β)
counts = np.asarray(pde.cluster_counts(sol.rho))
h = 2 * np.pi / m
# float32 (JAX's default): the fluxes telescope, so mass is conserved to rounding, about 1e-7
# here; with jax.config.update("jax_enable_x64", True) first, about 1e-15
mass = np.asarray(sol.rho.sum(axis=1) * h)
print(f"k* = {k_star}, clusters at t = {float(sol.ts[-1]):g}: {counts[-1]}, "
      f"mass drift {np.ptp(mass):.1e}")

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
theta = np.asarray(pde.circle_grid(m)[0])
im = ax.pcolormesh(theta, np.asarray(sol.ts), np.log10(np.asarray(sol.rho) + 1e-12),
                   shading="auto", vmin=-3, vmax=1.5)
fig.colorbar(im, ax=ax, label="log₁₀ ρ")
ax.set(xlabel="θ", ylabel="t", title=f"β = {beta:g}, M = {m}: k* = {k_star} clusters")
fig.tight_layout()
fig.savefig(out / "density_solver.png", dpi=120)
print(out / "density_solver.png")
