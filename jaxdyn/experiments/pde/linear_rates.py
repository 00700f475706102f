"""The linear growth rates λ_k of the uniform state at the β of the S¹ cluster runs, as a result file.

λ_k = (k²/β) I_k(β)/I_0(β) (Q = K = V = I, σ = 0; ``jaxdyn.pde.linear_rates``, docs/math.md §C.2)
for k = 1..K at each β of the cluster run, with k* = argmax_k λ_k and the ratios of its
neighbours' rates to λ* (how close the nearest competitors of k* grow); at the β of the particle
run, the time ln(c·√N)/λ* an iid start's O(N^{-1/2}) modes take to reach the mode threshold c.
The β, K, N and c are read from the committed result files of those runs (their configs), so the
rates belong to the runs the density guide reports::

    python -m jaxdyn.experiments.pde.linear_rates --out docs/results/pde/pde_linear_rates.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CLUSTERS = "docs/results/pde/pde_s1_clusters.json"
PARTICLES = "docs/results/pde/pde_s1_cluster_particles.json"


def _config(path):
    from ...config import parse_yaml

    return parse_yaml(json.loads(Path(path).read_text())["meta"]["config"], str(path))


def _betas(cfg):
    b = cfg["sweep"]["beta"]
    return [float(x) for x in (b if isinstance(b, list) else [b])]


def rates(betas, k_max) -> list:
    """Per β: k*, λ_1..λ_K, λ*, and λ_{k*±1}/λ* (None where k* ± 1 is outside 1..K).

    Args:
      betas: the inverse temperatures.
      k_max: the largest mode K.

    Returns:
      One dict per β.

    Raises:
      ValueError: k* outside 1..K at some β.
    """
    from ... import pde

    ks = np.arange(1, k_max + 1)
    out = []
    for b in betas:
        lam = pde.linear_rates(b, ks)
        k = pde.most_unstable_mode(b)
        if not 1 <= k <= k_max:
            raise ValueError(f"k* = {k} at β = {b:g} lies outside k = 1..{k_max}")
        star = float(lam[k - 1])
        out.append({"beta": b, "k_star": k, "lambda_star": star, "rates": [float(x) for x in lam],
                    "prev_ratio": float(lam[k - 2]) / star if k >= 2 else None,
                    "next_ratio": float(lam[k]) / star if k < k_max else None})
    return out


def measure(clusters=CLUSTERS, particles=PARTICLES) -> dict:
    """The rates at the cluster run's β and the iid window at the particle run's β.

    Returns:
      The results of the result file.
    """
    cc = _config(clusters)
    pc = _config(particles)
    k_max = int(cc["growth_k"])
    n = int(pc["particles"]["cluster_n"])
    c = float(pc["particles"]["mode_threshold"])
    pbetas = _betas(pc)
    window = [{"beta": p["beta"], "k_star": p["k_star"], "next_ratio": p["next_ratio"],
               "prev_ratio": p["prev_ratio"], "lambda_star": p["lambda_star"],
               "iid_window": float(np.log(c * np.sqrt(n)) / p["lambda_star"])}
              for p in rates(pbetas, k_max)]
    return {"source": {"clusters": str(clusters), "particles": str(particles)},
            "k_max": k_max, "points": rates(_betas(cc), k_max),
            "particles": {"n": n, "mode_threshold": c, "points": window}}


def main(argv=None) -> None:
    """Compute the rates and write the result file."""
    from ..guide_numbers import clock, write_measurement

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", default=CLUSTERS)
    p.add_argument("--particles", default=PARTICLES)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    started = clock()
    res = measure(a.clusters, a.particles)
    cmd = "python -m jaxdyn.experiments.pde.linear_rates"
    if a.clusters != CLUSTERS:
        cmd += f" --clusters {a.clusters}"
    if a.particles != PARTICLES:
        cmd += f" --particles {a.particles}"
    write_measurement(a.out, "pde", cmd + f" --out {a.out}", res, started)


if __name__ == "__main__":
    main()
