"""A Gaussian blow-up: the moment ODE of Paper B reaches a pole at T*, against its closed form.

Run: ``python examples/gaussian_blowup.py --out figures/`` (default ``--out``: a new temporary folder).
"""

import jax.numpy as jnp
import numpy as np

import jaxdyn
from _common import out_dir, pyplot

out = out_dir(__doc__)

# m' = (A + V) m + V Σ B m + b,   Σ' = A Σ + Σ Aᵀ + V Σ B Σ + Σ Bᵀ Σ Vᵀ   (V = I, B ≻ 0: blow-up)
S0 = jnp.array([[1.0, 0.3], [0.3, 0.5]])
B = jnp.array([[1.0, 0.2], [0.0, 0.8]])
V = jnp.eye(2)
A = jnp.zeros((2, 2))
sol = jaxdyn.solve_moments(jnp.zeros(2), S0, A=A, B=B, V=V, t1=2.0,
                           saveat=np.linspace(0.0, 2.0, 201))
if bool(jnp.all(A == 0)):  # A = 0: T* = 1/λmax(Σ0^½ (B + Bᵀ) Σ0^½)
    T_closed = float(jaxdyn.gaussian.vi_blowup_time(S0, B, 1.0))
else:  # for any A: the first zero of λmin(Σ(t)⁻¹), Σ(t)⁻¹ solving a linear ODE (V = vI)
    T_closed = jaxdyn.gaussian.vi_blowup_time_general(S0, A, B, 1.0, t_max=2.0, n_grid=100)
print(f"{sol.names}: T* = {float(sol.blowup_time):.10f}, closed form {T_closed:.10f}")
assert sol.names == "blowup", f"no blow-up before t1 = 2: {sol.names}"
assert abs(float(sol.blowup_time) / T_closed - 1) < 1e-5, (  # float32; 1e-10 in float64
    f"T* = {float(sol.blowup_time)} against the closed form {T_closed}")

plt = pyplot()
fig, ax = plt.subplots(figsize=(5, 3.2))
ts, tr = np.asarray(sol.ts), np.trace(np.asarray(sol.cov), axis1=-2, axis2=-1)
ax.semilogy(ts, tr, label="tr Σ(t)")
ax.axvline(T_closed, color="k", ls="--", lw=1, label="T* (closed form)")
ax.set(xlabel="t", ylabel="tr Σ", title="Gaussian closure, V = I, B ≻ 0")
ax.legend()
fig.tight_layout()
fig.savefig(out / "gaussian_blowup.png", dpi=120)
print(out / "gaussian_blowup.png")
