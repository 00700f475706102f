"""Multi-head causal attention on S²: 4 heads with and without a causal mask.

Run: ``python examples/multihead_causal.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp
from matplotlib.ticker import MaxNLocator

import jaxdyn
from _common import out_dir, pyplot

out = out_dir(__doc__)
H, N, d, beta = 4, 64, 3, 4.0
kq, kk, kx = jax.random.split(jax.random.PRNGKey(0), 3)
# per-head weights: Q_h = I + G_h/√d, K_h = I + G'_h/√d, V_h = I/H (the output projection absorbed)
Q = jnp.eye(d) + jax.random.normal(kq, (H, d, d)) / jnp.sqrt(d)
K = jnp.eye(d) + jax.random.normal(kk, (H, d, d)) / jnp.sqrt(d)
V = jnp.broadcast_to(jnp.eye(d) / H, (H, d, d))
x0 = jaxdyn.sample_sphere(kx, N, d)

curves = {}
for mask in ("none", "causal"):
    model = jaxdyn.MultiHeadAttention(Q, K, V, beta, mask=mask)  # particle i attends to j <= i
    traj = jaxdyn.simulate(model, x0, t1=8.0, dt=0.1, save_every=4)
    curves[mask] = (traj.ts, jax.vmap(jaxdyn.cluster_count)(traj.xs))
    if mask == "causal":  # the first particle attends only to itself and V_h sums to I: it stays
        assert float(jnp.max(jnp.abs(traj.xs[-1, 0] - x0[0]))) < 1e-5

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
for mask, (t, c) in curves.items():
    ax.plot(t, c, label={"none": "full attention", "causal": "causal mask"}[mask])
ax.set(xlabel="t (depth)", ylabel="clusters (δ = 1e-4)", ylim=(0, N + 4),  # cluster_count's default δ
       title=f"{H} heads, β = {beta:g}, N = {N} on S²")
ax.yaxis.set_major_locator(MaxNLocator(integer=True))
ax.legend(loc="lower left")  # the curves start at N and fall to the right
fig.tight_layout()
fig.savefig(out / "multihead_causal.png", dpi=120)
print(out / "multihead_causal.png")
