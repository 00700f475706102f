"""A reachability problem: optimised controls steer N(m0, S0) to a Gaussian target at t1 = 1.

Run: ``python examples/reachability.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.ticker import MaxNLocator

import jaxdyn
from jaxdyn import control
from _common import out_dir, pyplot

jax.config.update("jax_enable_x64", True)  # reached means W2 < 1e-4, i.e. W2² < 1e-8
out = out_dir(__doc__)

m0, S0 = jnp.array([1.0, 0.0]), jnp.eye(2)
m1, S1 = control.random_target(3, 2)                  # a random target mean and covariance
# piecewise-constant A(t), b(t), V(t), B(t) on 4 pieces, from small random controls; optax
# L-BFGS on the Bures W2² at t1, gradients through the moment ODE. verify=True (the default)
# re-solves the result independently at rtol 1e-11; skipped here to keep the example short.
options = control.ReachOptions(init="random", with_certificate=False, verify=False)
res = jaxdyn.reach(m0, S0, m1, S1, t1=1.0, n_pieces=4, options=options)
print(f"{res.names}: W2 = {float(res.w2_optimizer):.2e} after {int(res.stats['iterations'])} "
      f"L-BFGS iterations")
assert res.names == "successful"

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
w2 = np.asarray(res.w2_history)
ax.semilogy(np.arange(len(w2)), w2, marker=".")
ax.axhline(1e-4, color="k", ls="--", lw=1, label="reached: W2 < 1e-4")
ax.set(xlabel="L-BFGS iteration", ylabel="Bures W2 to the target at t1",
       title="d = 2, all controls free, 4 pieces")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.legend()
fig.tight_layout()
fig.savefig(out / "reachability.png", dpi=120)
print(out / "reachability.png")
