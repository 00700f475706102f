"""Chunks of a sweep that share every static field reuse one compiled program: the second
chunk triggers no XLA compilation (counted with jax.monitoring), and gives the same numbers
as a chunk computed on its own."""

import jax
import numpy as np
import pytest

from jaxdyn.experiments import segments, sphere_common as sc
from jaxdyn.experiments import concentration, sphere
from jaxdyn.experiments.engine import grid_points, point_config, resolve_config

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _points(kind, **extra):
    raw = {"kind": kind, "d": 3, "n": 24, "t1": 0.6, "dt": 0.1, "save_every": 2, "method": "rk4",
           "sweep": {"beta": [0.5, 1.0, 2.0, 4.0]}, **extra}
    cfg = resolve_config(raw)
    _, pts = grid_points(cfg)
    return [point_config(cfg, p) for p in pts]


# the sphere kind by default; the concentration kind (the same segment cache and ensemble
# path, another kind's variables) under -m slow
KINDS = [
    ("sphere", sphere, {"snapshots": [0.0, 0.6]}),
    pytest.param("concentration", concentration, {"w2_methods": ["coupling"]},
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kind,module,extra", KINDS)
def test_second_chunk_does_not_recompile(kind, module, extra):
    pcs = _points(kind, **extra)
    first, second = pcs[:2], pcs[2:]
    module.run_points(first)  # compiles the segment programs

    compiles = []

    def listener(event, duration, **kw):
        if event == COMPILE_EVENT:
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        vars_b, _ = module.run_points(second)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [], f"{len(compiles)} compilation(s) for a chunk with a known signature"

    # and the reused program computes what a fresh one does: clear the cache, recompute
    segments.SEGMENTS.clear()
    vars_c, _ = module.run_points(second)
    for k, (_, v) in vars_b.items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(vars_c[k][1]), err_msg=k)


@pytest.mark.parametrize("kind,module,extra", KINDS)
def test_ensemble_path_equals_vmapped_simulate(kind, module, extra):
    # small N: chunks integrate with simulate_ensemble; `ensemble: false` takes
    # vmap(simulate); the recorded variables agree to float32 rounding (a chunk of two
    # points, the chunk the test above compiles: its ensemble programs are reused)
    assert sc.uses_ensemble(_points(kind, **extra)[0])
    a, _ = module.run_points(_points(kind, **extra)[2:])
    b, _ = module.run_points(_points(kind, ensemble=False, **extra)[2:])
    assert not sc.uses_ensemble(_points(kind, ensemble=False, **extra)[0])
    for k, (_, v) in a.items():
        np.testing.assert_allclose(np.asarray(v, float), np.asarray(b[k][1], float), atol=2e-5,
                                   rtol=0, err_msg=k)
