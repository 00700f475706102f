"""A β sweep on S²: one vmapped simulation per β; mean inner product and clusters against depth.

Run: ``python examples/beta_sweep.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp
from matplotlib.ticker import FixedLocator, NullLocator

import jaxdyn
from _common import out_dir, pyplot

out = out_dir(__doc__)
betas = jnp.array([1.0, 4.0, 16.0, 64.0])
x0 = jaxdyn.sample_sphere(jax.random.PRNGKey(0), 128, 3)  # N = 128 tokens on S²
I = jnp.eye(3)

# a stack of models (one per β) is one pytree with a leading axis: vmap over it
models = jaxdyn.stack_models([jaxdyn.SphereAttention(I, I, I, beta=b) for b in betas])


def run(model):
    """One β: the trajectory's times, clouds, mean inner product and status."""
    traj = jaxdyn.simulate(model, x0, t1=20.0, dt=0.1, method="rk4", save_every=5)
    ip = jnp.einsum("snd,smd->snm", traj.xs, traj.xs).mean(axis=(1, 2))  # 1 = one cluster
    return traj.ts, traj.xs, ip, traj.status


ts, xs, ip, status = jax.jit(jax.vmap(run))(models)
assert bool(jnp.all(status == jaxdyn.status_code("successful")))
# clusters: connected components of ⟨x_i, x_j⟩ > 1 − δ (δ = 1e-4, the default), per saved cloud
counts = jaxdyn.cluster_count(xs)  # (β, saved time)
print("clusters at t = 20:", {f"β = {float(b):g}": int(c[-1]) for b, c in zip(betas, counts)})

plt = pyplot()
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.4))
for b, t, y, c in zip(betas, ts, ip, counts):
    ax0.plot(t, y, label=f"β = {float(b):g}")
    ax1.plot(t, c, label=f"β = {float(b):g}")
ax0.set(xlabel="t (depth)", ylabel=r"mean $\langle x_i, x_j\rangle$", ylim=(-0.02, 1.02))
# large β: a metastable phase of many clusters that lasts long after the first merges
ax1.set_yscale("log", base=2)
ax1.yaxis.set_major_locator(FixedLocator([1, 2, 4, 8, 16, 32, 64, 128]))
ax1.yaxis.set_major_formatter("{x:.0f}")
ax1.yaxis.set_minor_locator(NullLocator())
ax1.set(xlabel="t (depth)", ylabel="clusters (δ = 1e-4)", ylim=(0.8, 160))
ax1.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)  # beside the axes
fig.suptitle("Q = K = V = I, N = 128 on S²")
fig.tight_layout()
fig.savefig(out / "beta_sweep.png", dpi=120)
print(out / "beta_sweep.png")
