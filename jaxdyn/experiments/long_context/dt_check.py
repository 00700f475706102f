"""The time step of the large dynamics configs, checked at n = 10⁴ against a step four times finer.

``configs/long_context_dynamics_large.yaml`` (S¹) and ``…_s2_large.yaml`` (S²) step RK4 at
dt = 0.2 with a frame every step. This runs their n = 10⁴ point, seed 0, up to ``T1`` at that
step and at dt = 0.05 with a frame every 4 steps (the same frames), and records each frame's
cluster count of both, as a ``long_context`` result file (renderer ``dt_check``):

    python -m jaxdyn.experiments.long_context.dt_check [OUT.json]

A few CPU-minutes on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

CONFIGS = {"S²": "configs/long_context_dynamics_s2_large.yaml",
           "S¹": "configs/long_context_dynamics_large.yaml"}
N, SEED, T1 = 10_000, 0, 5.0
FINE = 4  # dt / FINE, a frame every FINE steps
OUT = "docs/results/long_context/long_context_dt_check.json"


def _point(path, **over):
    from ...config import parse_yaml
    from ..guide_numbers import ROOT
    from ..planning import resolve_config

    text = (ROOT / path).read_text()
    cfg = resolve_config(parse_yaml(text, path))
    sweep = cfg.pop("sweep", {}) or {}
    d = sweep.get("d", [cfg["d"]])[0]
    return {**cfg, "d": d, "n": N, "seed": SEED, "t1": T1, **over}


def measure() -> dict:
    """Per sphere: the frames' times and cluster counts at the config's dt and at dt / FINE."""
    import jax

    jax.config.update("jax_enable_x64", True)  # S¹ runs in float64; S² states float32
    from .run import dynamics_point

    out = {}
    for name, path in CONFIGS.items():
        coarse = _point(path)
        fine = _point(path, dt=coarse["dt"] / FINE, save_every=coarse["save_every"] * FINE)
        rows = {}
        for label, pc in (("coarse", coarse), ("fine", fine)):
            vals, ts = dynamics_point(pc)
            rows[label] = {"dt": pc["dt"], "times": [float(t) for t in ts],
                           "counts": [int(c) for c in np.asarray(vals["cluster_count"][1])]}
        c, f = rows["coarse"], rows["fine"]
        same = [a == b for a, b in zip(c["counts"], f["counts"])]
        out[name] = {"config": path, "n": N, "seed": SEED, "d": coarse["d"], **rows,
                     "frames": len(same), "frames_equal": int(sum(same)),
                     "times_agree": bool(np.allclose(c["times"], f["times"][:len(c["times"])]))}
    return out


def main(argv=None) -> int:
    """Measure and write the result file (``OUT`` unless a path is given); returns 0."""
    from ..guide_numbers import clock, write_measurement

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else OUT)
    started = clock()
    results = measure()
    write_measurement(out, "long_context", "python -m jaxdyn.experiments.long_context.dt_check",
                      results, started)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
