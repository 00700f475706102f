"""W2 reached by measure-to-measure control against the depth L, seed by seed.

The settings of the slow depth test (``tests/test_control_measure.py``): N particles (96),
float64, RK4 with max(2, 16 // L) steps a layer; L = 1 from small random weights (Adam 80
steps, ε annealed 0.1 → 0.01, then at most 40 L-BFGS iterations at ε = 0.01); each deeper L from
the optimum at L/2 with its layers repeated (Adam 30 steps at learning rate 0.01, then at most 40
L-BFGS iterations, ε = 0.01). S² (uniform → three vMF clusters, sphere attention weights) and R²
(N(0, I) → two Gaussian clusters, attention and affine weights, energy cost λ = 1e-3), the
clouds of the ``control`` kind's point with that seed. Recorded per seed and depth: the exact W2
to the target cloud the loss used, √S_ε at ε = 0.01 and 1e-3, the exact W2 to an independent
draw of the target, the loss replayed at 4× the steps, the optimiser's status and stop reason.

    python -m jaxdyn.experiments.reachability.depth --seeds 5 --out FILE.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np

LAYERS = (1, 2, 4, 8, 16)
TARGETS = {"sphere_clusters": dict(clusters=3, kappa=20.0),
           "gaussian_to_mixture": dict(clusters=2, separation=2.0, spread=0.3)}


def sweep(problem: str, seed: int, n: int = 96, layers=LAYERS) -> dict:
    """One seed's climb through the depths (module doc).

    Args:
      problem: ``"sphere_clusters"`` or ``"gaussian_to_mixture"``.
      seed: the seed of the clouds (and of the first depth's random start).
      n: particles.
      layers: the depths, each twice the last.

    Returns:
      ``{"w2_start", "w2_floor", "rows": [{"L", "w2", "sqrt_s_eps", "sqrt_s_eps_1e-3",
      "w2_resampled", "loss", "loss_fine", "status", "stop"}]}``.

    Raises:
      ValueError: an unknown problem.
    """
    import jax

    from ...control import measure_control, measure_loss, repeat_layers
    from ...distances import w2_exact
    from ..control.run import clouds, resampled_target

    if problem not in TARGETS:
        raise ValueError(f"problem {problem!r}: one of {sorted(TARGETS)}")
    pc = dict(problem=problem, seed=int(seed), n_particles=n, target=TARGETS[problem])
    model = "euclidean" if problem == "gaussian_to_mixture" else "sphere"
    cost = dict(cost="energy", cost_weight=1e-3) if model == "euclidean" else {}
    rows, prev, prev_L = [], None, None
    with jax.enable_x64(True):
        x0, y = clouds(pc)
        y2 = resampled_target(pc)
        for L in layers:
            s = max(2, 16 // L)
            kw = dict(n_layers=L, model=model, epsilon=0.01, steps_per_layer=s, seed=int(seed),
                      lbfgs_steps=40, **cost)
            if prev is None:
                r = measure_control(x0, y, epsilon_start=0.1, adam_steps=80, **kw)
            else:
                r = measure_control(x0, y, init=repeat_layers(prev, L // prev_L), epsilon_start=0.01,
                                    adam_steps=30, adam_lr=0.01, **kw)
            prev, prev_L = r.controls, L
            xl = np.asarray(r.xs[-1])
            ev = dict(model=model, steps_per_layer=s, free=())
            same = float(measure_loss(r.controls, x0, y, epsilon=0.01, **ev))
            fine = float(measure_loss(r.controls, x0, y, epsilon=0.01,
                                      **dict(ev, steps_per_layer=4 * s)))
            s3 = float(measure_loss(r.controls, x0, y, epsilon=1e-3, **ev))
            rows.append({"L": L, "w2": float(w2_exact(xl, y).value),
                         "sqrt_s_eps": float(np.sqrt(max(same, 0.0))),
                         "sqrt_s_eps_1e-3": float(np.sqrt(max(s3, 0.0))),
                         "w2_resampled": float(w2_exact(xl, y2).value),
                         "loss": same, "loss_fine": fine, "status": r.names,
                         "stop": int(r.stats["stop"])})
        return {"w2_start": float(w2_exact(x0, y).value), "w2_floor": float(w2_exact(y, y2).value),
                "rows": rows}


def main(argv=None) -> None:
    """Run the sweeps of both problems for seeds 0 … k−1 and write a result file."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--problem", action="append", default=None, help="default: both")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    started = clock()
    cmd = (f"python -m jaxdyn.experiments.reachability.depth --seeds {a.seeds} --n {a.n} "
           + "".join(f"--problem {q} " for q in a.problem or []) + f"--out {a.out}")
    problems = a.problem or list(TARGETS)
    res = {problem: {"n": a.n, "layers": list(LAYERS), "seeds": []} for problem in problems}
    for s in range(a.seeds):  # seed by seed, both problems: an interrupted run stays balanced
        for problem in problems:
            ts = time.perf_counter()
            out = sweep(problem, s, a.n)
            out.update(seed=s, seconds=time.perf_counter() - ts)
            res[problem]["seeds"].append(out)
            print(problem, s, [round(r["w2"], 4) for r in out["rows"]], f"{out['seconds']:.0f} s",
                  flush=True)
            # written after every seed: an interrupted run keeps the seeds it finished
            write_measurement(a.out, "control_depth", cmd, res, started)


if __name__ == "__main__":
    main()
