"""The step function of every experiment kind lowers for cuda and tpu.

Each kind's ``step_functions(point_cfg)`` returns the device computations its ``run_points`` runs
for one grid point (the segment of the particle kinds, the moment solves of ``gaussian``, the
loss, verification and transfer of ``reachability``, the density solve of ``pde``, the encoder
pass of ``gaussianity``, the layer integration of ``variants``); each is exported at a small
size, models built from the config's NumPy weights as ``run_points`` builds them.
"""

import jax
import pytest

from jaxdyn.experiments import get_kind, resolve_config
from jaxdyn.experiments.engine import grid_points, point_config

from ._export import export_check

SPECTRAL = {"ensemble": "spectral", "mu": [1.0, 0.4, -0.2], "eigenspace_angle_deg": 8.0, "plane": [0, 1]}
SMALL = {"n": 8, "t1": 0.4, "dt": 0.1, "save_every": 2}
PDE = {"kind": "pde", "m": 32, "t1": 0.5, "n_save": 3, "dtype": "float32", "growth_k": 4,
       "particles": {"n": [8], "repeats": [1], "times": [0.0, 0.5], "dt": 0.25, "dtype": "float32"}}

CASES = {
    "sphere_ensemble": {"kind": "sphere", **SMALL, "cluster_stats": True},
    "sphere_vmap": {"kind": "sphere", **SMALL, "ensemble": False, "sweep": {"beta": [1.0, 2.0]}},
    "sphere_heads_causal": {"kind": "sphere", **SMALL, "heads": 2, "heads_spread": 0.3, "mask": "causal",
                            "positions": "alibi", "weights": {"ensemble": "gaussian", "seed": 1}},
    "sphere_sinkhorn_attention": {"kind": "sphere", **SMALL, "attention": "sinkhorn", "kernel": "dense"},
    "concentration": {"kind": "concentration", **SMALL, "weights": SPECTRAL, "ensemble": False,
                      "w2_methods": ["coupling", "sinkhorn"]},
    "concentration_ensemble": {"kind": "concentration", **SMALL, "weights": SPECTRAL},
    "gaussian_trajectory": {"kind": "gaussian", "n": 16, "t1": 0.1, "dt": 0.05, "save_every": 1,
                            "snapshots": [0.0], "snapshot_particles": 4, "n_directions": 4,
                            "activation": "relu", "A": [[-0.5, 0.0], [0.0, -0.5]]},
    "gaussian_phase_diagram": {"kind": "gaussian", "study": "phase_diagram", "t1": 0.5,
                               "phase": {"a": [-1.0, 1.0, 3.0], "c": [-1.0, 1.0, 2.0]}},
    "reachability": {"kind": "reachability", "d": 2, "n_pieces": 2, "n_save": 3,
                     "transfer": {"layers": [2], "steps_per_piece": 2}},
    "reachability_linear_f32": {"kind": "reachability", "d": 2, "n_pieces": 2, "n_save": 3,
                                "control_kind": "linear", "dtype": "float32", "tol": 1e-2,
                                "transfer": {"layers": [2], "steps_per_piece": 2}},
    "pde_clusters": {**PDE, "eps": 1e-3, "particles": {**PDE["particles"], "cluster_n": 8}},
    "pde_particles_fourier": {**PDE, "mode": "particles",
                              "particles": {**PDE["particles"], "kernel": "fourier"}},
    "pde_s2": {**PDE, "mode": "s2", "n_lat": 4},
    "pde_float64_noise": {**PDE, "dtype": "float64", "sigma": 0.1},
    "gaussianity_deit": {"kind": "gaussianity", "architecture": "deit", "layers": 1, "model": "random",
                         "batch": 2, "seq": 4},
    "gaussianity_modernbert": {"kind": "gaussianity", "architecture": "modernbert", "layers": 1,
                               "model": "random", "batch": 2, "seq": 4},
    "gaussianity_nongaussian": {"kind": "gaussianity", "architecture": "deit", "layers": 2,
                                "model": "nongaussian", "batch": 2, "seq": 4},
    "variants": {"kind": "variants", **SMALL},
    "variants_noisy_preln": {"kind": "variants", **SMALL, "sigma": 0.2, "norm": "preln"},
    "variants_redraw_ngpt": {"kind": "variants", **SMALL, "norm": "ngpt",
                             "depth": {"source": "redraw", "period": 0.2, "heads": 2},
                             "weights": {"ensemble": "gaussian"}},
}
X64 = {"pde_float64_noise"}


def _point(raw):
    cfg = resolve_config(raw)
    get_kind(cfg["kind"]).check(cfg)
    _, points = grid_points(cfg)
    return cfg, point_config(cfg, points[0] if points else {})


@pytest.mark.parametrize("case", sorted(CASES))
def test_kind_step_functions_export(case):
    with jax.enable_x64(case in X64):
        cfg, pc = _point(CASES[case])
        steps = get_kind(cfg["kind"]).step_functions(pc)
    assert steps, case
    for name, step in steps.items():
        with jax.enable_x64(step.x64 or case in X64):
            try:
                seen = export_check(step.fn, *step.args)
            except Exception as e:  # name the step in the failure
                raise AssertionError(f"{case}: step {name!r} does not export: {type(e).__name__}: "
                                     f"{str(e)[:1500]}") from e
        assert set(seen) == {"cuda", "tpu"}, (case, name)


def test_bert_encoder_pass_exports():
    from jaxdyn.encoder_host import find_minilm

    try:
        find_minilm()
    except FileNotFoundError:
        pytest.skip("the MiniLM checkpoint package is not installed")
    cfg, pc = _point({"kind": "gaussianity", "model": "random", "batch": 2, "seq": 4})
    (step,) = get_kind("gaussianity").step_functions(pc).values()
    export_check(step.fn, *step.args)
