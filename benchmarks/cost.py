"""The work of a workload's headline computation, from XLA's cost analysis (no run).

    python benchmarks/cost.py large_n phase      # prints one JSON line: name -> cost

For each workload with a loop-free form of its headline maths, the program is lowered and
compiled for this machine's backend and ``jax.jit(f).lower(...).compile().cost_analysis()``
gives its FLOPs, transcendentals (exps) and bytes accessed. XLA counts a while loop's body
once, whatever its trip count, so a blocked kernel (a scan over key blocks) or an ODE loop
would be undercounted: the cost is taken from the dense, loop-free program of the same maths
(``kernel="dense"``), times a known static count where the workload repeats it (steps).
The bytes are that dense program's (its N x N intermediates), not the blocked kernel's, so
the suite's floor uses FLOPs and exps only; see :func:`suite.cost_floor`.

Workloads without such a form (adaptive ODE solves, optimisers, whole CLI runs) are left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _analysis(fn, *args):
    import jax

    ca = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(ca, (list, tuple)):  # one entry per device program in some versions
        ca = ca[0]
    return {k: float(ca[k]) for k in ("flops", "transcendentals", "bytes accessed") if k in ca}


def _field(n, d=3, beta=10.0):
    import jax
    import jax.numpy as jnp

    import jaxdyn

    eye = jnp.eye(d, dtype=jnp.float32)
    model = jaxdyn.SphereAttention(eye, eye, eye, beta, kernel="dense")
    x = jaxdyn.sample_sphere(jax.random.PRNGKey(0), n, d)
    return _analysis(lambda y: model(0.0, y), x), f"SphereAttention dense field, N = {n}, d = {d}"


def large_n():
    """One field evaluation at the headline N (4096), dense form."""
    return _field(4096)


def roofline():
    """One field evaluation at the largest N of the roofline rows (8192), dense form."""
    return _field(8192)


def phase():
    """One step of the published scheme for all 16 x 512 systems of n = 32 on S¹, x 300."""
    import jax
    import jax.numpy as jnp

    systems, n, d, beta, h, steps = 16 * 512, 32, 2, 9.0, 0.1, 300

    def step(x):
        a = jax.nn.softmax(beta * jnp.einsum("snd,smd->snm", x, x), axis=-1)
        y = x + h * jnp.einsum("snm,smd->snd", a, x)
        return y / jnp.linalg.norm(y, axis=-1, keepdims=True)

    x = jnp.ones((systems, n, d), jnp.float32) / jnp.sqrt(2.0)
    one = _analysis(step, x)
    return ({k: v * steps for k, v in one.items()},
            f"the published step for 8192 systems x n = 32 (β = 9 for the count), x {steps} steps")


COSTS = {"large_n": large_n, "roofline": roofline, "phase": phase}


def main(names):
    """Print one JSON line: workload -> its cost counts."""
    import jax

    out = {}
    for name in names:
        if name not in COSTS:
            continue
        counts, program = COSTS[name]()
        out[name] = {"program": program, **counts, "backend": jax.default_backend(),
                     "jax": jax.__version__}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:] or list(COSTS))
