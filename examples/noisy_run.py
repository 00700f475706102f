"""A noisy run on S²: dx_i = P⊥(x_i) V Σ_j w_ij x_j dt + σ P⊥(x_i) ∘ dW_i for three σ.

Run: ``python examples/noisy_run.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp

import jaxdyn
from _common import out_dir, pyplot

out = out_dir(__doc__)
I = jnp.eye(3)
model = jaxdyn.SphereAttention(I, I, I, beta=4.0)
x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 64, 3)
sigmas = jnp.array([0.0, 0.2, 0.4])


def run(sigma):
    """One σ: the saved times and the mean inner product."""
    # geodesic Euler–Maruyama: on the sphere by construction; step k's increments come from
    # fold_in(key, k), so a run depends on its key alone. One key for every σ, deliberately:
    # the runs share one Brownian path (common random numbers), so the curves differ by σ alone.
    # Independent noises: pass one key per σ, e.g. run(sigma, key) vmapped over
    # (sigmas, jax.random.split(jax.random.PRNGKey(1), len(sigmas))).
    sol = jaxdyn.simulate_sde(model, x0, jax.random.PRNGKey(1), sigma=sigma, t1=20.0, dt=0.05,
                              save_every=10)
    return sol.ts, jnp.einsum("snd,smd->snm", sol.xs, sol.xs).mean(axis=(1, 2))


ts, ip = jax.jit(jax.vmap(run))(sigmas)

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
for s, t, y in zip(sigmas, ts, ip):
    ax.plot(t, y, label=f"σ = {float(s):g}")
ax.set(xlabel="t (depth)", ylabel=r"mean $\langle x_i, x_j\rangle$",
       title="β = 4, N = 64 on S², one noise path")
ax.legend(loc="best")
fig.tight_layout()
fig.savefig(out / "noisy_run.png", dpi=120)
print(out / "noisy_run.png")
