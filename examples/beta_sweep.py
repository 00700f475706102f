"""A β sweep on S²: one vmapped simulation per β, mean pairwise inner product against depth.

Run: ``python examples/beta_sweep.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp

import jaxdyn
from _common import out_dir, pyplot

out = out_dir(__doc__)
betas = jnp.array([1.0, 4.0, 16.0, 64.0])
x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 128, 3)  # N = 128 tokens on S²
I = jnp.eye(3)

# a stack of models (one per β) is one pytree with a leading axis: vmap over it
models = jaxdyn.stack_models([jaxdyn.SphereAttention(I, I, I, beta=b) for b in betas])


def run(model):
    """One β: the trajectory's times, mean inner product and status."""
    traj = jaxdyn.simulate(model, x0, t1=10.0, dt=0.1, method="rk4", save_every=5)
    ip = jnp.einsum("snd,smd->snm", traj.xs, traj.xs).mean(axis=(1, 2))  # 1 = one cluster
    return traj.ts, ip, traj.status


ts, ip, status = jax.jit(jax.vmap(run))(models)
assert bool(jnp.all(status == jaxdyn.status_code("successful")))

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
for b, t, y in zip(betas, ts, ip):
    ax.plot(t, y, label=f"β = {float(b):g}")
ax.set(xlabel="t (depth)", ylabel="mean ⟨x_i, x_j⟩", title="Q = K = V = I, N = 128 on S²")
ax.legend(loc="lower right")
fig.tight_layout()
fig.savefig(out / "beta_sweep.png", dpi=120)
print(out / "beta_sweep.png")
