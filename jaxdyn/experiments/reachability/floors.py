"""The sampling floor of the measure-control targets: how far two N-samples of one law lie apart.

A cloud pushed exactly onto a target sample ``ν_N`` lies ``W2(ν_N, ν'_N)`` from an independent
sample ``ν'_N`` of the same law; that distance moves with the draw (the share of each cluster
varies), so it is measured over many pairs: the pair of seed k is the target of the ``control``
kind's point with seed k (``clouds``) and its independent redraw (``resampled_target``), the
exact W2 between them. The targets are those of ``configs/control_sphere_clusters.yaml`` (three
vMF clusters on S², κ = 20) and ``configs/control_gaussian_to_mixture.yaml`` (two Gaussian
clusters in R², ±2 e₁, standard deviation 0.3).

    python -m jaxdyn.experiments.reachability.floors --n 96 --pairs 400 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

#: the two targets: problem → the ``target`` field of its config
TARGETS = {
    "sphere_clusters": {"clusters": 3, "kappa": 20.0},
    "gaussian_to_mixture": {"clusters": 2, "separation": 2.0, "spread": 0.3},
}


def pair_distances(problem: str, n: int, seeds) -> np.ndarray:
    """Exact W2 between the target sample of each seed and its independent redraw.

    Args:
      problem: a key of :data:`TARGETS`.
      n: the number of points of each sample.
      seeds: the seeds (one pair each).

    Returns:
      (len(seeds),) the distances.

    Raises:
      ValueError: an unknown problem, or n < 2.
    """
    import jax

    from ...distances import w2_exact
    from ..control.run import clouds, resampled_target

    if problem not in TARGETS:
        raise ValueError(f"problem {problem!r}: one of {sorted(TARGETS)}")
    if n < 2:
        raise ValueError(f"n = {n}: at least 2 points a sample")
    out = []
    with jax.enable_x64(True):
        for s in seeds:
            pc = {"problem": problem, "seed": int(s), "n_particles": int(n), "target": TARGETS[problem]}
            y = clouds(pc)[1]
            out.append(float(w2_exact(y, resampled_target(pc)).value))
    return np.asarray(out)


def describe(w) -> dict:
    """Mean, its standard error, the 5–95 % range, smallest and largest of the distances."""
    w = np.asarray(w, float)
    return {"pairs": int(w.size), "mean": float(w.mean()),
            "standard_error": float(w.std(ddof=1) / np.sqrt(w.size)),
            "p05": float(np.quantile(w, 0.05)), "p95": float(np.quantile(w, 0.95)),
            "min": float(w.min()), "max": float(w.max()), "seed_0": float(w[0])}


def measure(n: int = 96, pairs: int = 400) -> dict:
    """The floors of both targets over ``pairs`` pairs (seeds 0 … pairs−1) at ``n`` points.

    Returns:
      ``{problem: {"target", "n", "distances", **describe}}`` and the seconds taken.
    """
    out = {}
    for problem, target in TARGETS.items():
        t0 = time.perf_counter()
        w = pair_distances(problem, n, range(pairs))
        out[problem] = {"target": target, "n": n, **describe(w), "seconds": time.perf_counter() - t0,
                        "distances": [round(float(x), 6) for x in w]}
    return out


def main(argv=None) -> None:
    """Measure the floors and write them with the run's provenance (``guide_numbers.write_measurement``)."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=96, help="points a sample (the slow depth test's N)")
    p.add_argument("--pairs", type=int, default=400, help="pairs of samples (seeds 0 … pairs−1)")
    p.add_argument("--out", required=True, help="the result file (JSON)")
    a = p.parse_args(argv)
    started = clock()
    res = measure(a.n, a.pairs)
    write_measurement(a.out, "sampling_floor",
                      f"python -m jaxdyn.experiments.reachability.floors --n {a.n} "
                      f"--pairs {a.pairs} --out {a.out}", res, started)


if __name__ == "__main__":
    main()
