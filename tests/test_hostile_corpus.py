"""Hostile corpus: bad input to the public API and the CLI ends in a named refusal.

Every case is a ``ValueError`` or ``TypeError`` whose message names the argument (or the config
field) and the problem, raised on the host before any compilation; a CLI case exits 2 with one
line ``jaxdyn: error: config field '...'`` (``jaxdyn config`` runs the same checks as ``jaxdyn
run`` without computing). Classes of case: NaN/inf, out of range, wrong type, wrong shape,
empty lists, unknown keys, fields of another kind. Under ``jax.jit``/``jax.vmap`` a traced value
out of its range is flagged in the result (NaN or −1), never a plausible number.

The ``ACCEPTED`` table holds inputs that look hostile but have a documented meaning, each
checked against that meaning.

Cost rule: the refusals happen before tracing (no compiled program); the one traced case
compiles one small program.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import jaxdyn
from jaxdyn import cli, clusters, control, distances, encoder, gaussian, models, pde, spectral
from jaxdyn.models import (
    NGPT,
    DepthAttention,
    EuclideanAttention,
    MultiHeadAttention,
    SphereAttention,
    redrawn_weights,
)
from jaxdyn.weights import build_weights

I2, I3 = np.eye(2), np.eye(3)
X3 = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0.6, 0.8, 0]])
XC = np.stack([np.cos(np.arange(5.0)), np.sin(np.arange(5.0))], 1)
RHO16 = np.full(16, 1 / (2 * math.pi)) * (1 + 0.1 * np.cos(np.arange(16)))
KEY = np.array([0, 0], np.uint32)  # a raw PRNG key: no device work to build it
BERT = dict(hidden_size=8, num_attention_heads=2, intermediate_size=8, num_hidden_layers=1)


def SA():
    """A tiny sphere model (built on the host, nothing compiled)."""
    return SphereAttention(I3, I3, I3, 1.0)


def CD():
    """A tiny density model on S¹."""
    return pde.CircleDensity(I2, I2, I2, 1.0, 16)


# ------------------------------------------------------------------ library: refused on the host

# (case, class, exception, the message's start, call)
LIBRARY = [
    ('sample_vmf kappa NaN', 'NaN/inf', ValueError, 'kappa must be a finite number > 0, got nan',
     lambda: jaxdyn.sample_vmf(KEY, 4, np.array([1., 0, 0]), np.nan)),
    ('sample_vmf mu zero', 'range', ValueError, 'mu must be a nonzero (finite) direction, got [0. 0. 0.]',
     lambda: jaxdyn.sample_vmf(KEY, 4, np.zeros(3), 1.0)),
    ('sample_vmf n -1', 'range', ValueError, 'n (number of particles) must be an integer >= 1, got -1',
     lambda: jaxdyn.sample_vmf(KEY, -1, np.array([1., 0, 0]), 1.0)),
    ('sample_sphere n 2.5', 'type', ValueError, 'n (number of particles) must be an integer >= 1, got 2.5',
     lambda: jaxdyn.sample_sphere(KEY, 2.5, 3)),
    ('sample_sphere d 0', 'range', ValueError, 'd (ambient dimension of S^(d-1)) must be an integer >= 2, got 0',
     lambda: jaxdyn.sample_sphere(KEY, 4, 0)),
    ('sample_mixture weight 1.5', 'range', ValueError, 'weight must lie in [0, 1) for a strictly positive density, got 1.5',
     lambda: jaxdyn.sample_mixture(KEY, 4, 3, weight=1.5)),
    ('sample_mixture kappa -1', 'range', ValueError, 'kappa must be a finite number > 0, got -1.0',
     lambda: jaxdyn.sample_mixture(KEY, 4, 3, kappa=-1.0)),
    ('SphereAttention beta NaN', 'NaN/inf', ValueError, 'beta (inverse temperature) must be > 0 and finite, got nan',
     lambda: SphereAttention(I3, I3, I3, np.nan)),
    ('SphereAttention beta -1', 'range', ValueError, 'beta (inverse temperature) must be > 0 and finite, got -1.0',
     lambda: SphereAttention(I3, I3, I3, -1.0)),
    ('SphereAttention Q 2x3', 'shape', ValueError, 'Q must be a square matrix of shape (d, d), got shape (2, 3)',
     lambda: SphereAttention(np.ones((2, 3)), I3, I3, 1.0)),
    ('SphereAttention kernel bogus', 'type', ValueError, "kernel must be one of ('dense', 'blocked', 'local', 'auto'), got 'bogus'",
     lambda: SphereAttention(I3, I3, I3, 1.0, kernel="bogus")),
    ('SphereAttention normalization bogus', 'type', ValueError, "normalization must be one of ('softmax', 'unnormalized', 'hardmax'), g",
     lambda: SphereAttention(I3, I3, I3, 1.0, normalization="x")),
    ('SphereAttention k_block 0', 'range', ValueError, 'k_block must be an integer >= 1 (or None), got 0',
     lambda: SphereAttention(I3, I3, I3, 1.0, k_block=0)),
    ('SphereAttention Q string', 'type', ValueError, 'Q must be a square matrix of shape (d, d), got shape ()',
     lambda: SphereAttention("abc", I3, I3, 1.0)),
    ('EuclideanAttention activation bogus', 'type', ValueError, "activation must be 'identity' or 'relu', got 'bogus'",
     lambda: EuclideanAttention(I3, I3, I3, activation="bogus")),
    ('EuclideanAttention b wrong length', 'shape', ValueError, 'b must have shape (3,) (or be a Control with values (n, 3)), got (2,)',
     lambda: EuclideanAttention(I3, I3, I3, b=np.ones(2))),
    ('MultiHeadAttention mask bogus', 'type', ValueError, "mask must be one of ('none', 'causal'), got 'bogus'",
     lambda: MultiHeadAttention(I3, I3, I3, 1.0, mask="bogus")),
    ('MultiHeadAttention attention bogus', 'type', ValueError, "attention must be one of ('softmax', 'l2', 'sinkhorn'), got 'x'",
     lambda: MultiHeadAttention(I3, I3, I3, 1.0, attention="x")),
    ('MultiHeadAttention alibi NaN', 'NaN/inf', ValueError, 'alibi slopes must be >= 0 and finite, got [nan]',
     lambda: MultiHeadAttention(I3, I3, I3, 1.0, alibi=np.nan)),
    ('MultiHeadAttention sinkhorn_iters 0', 'range', ValueError, 'sinkhorn_iters must be an integer >= 1, got 0',
     lambda: MultiHeadAttention(I3, I3, I3, 1.0, attention="sinkhorn", sinkhorn_iters=0)),
    ('MultiHeadAttention V d mismatch', 'shape', ValueError, 'V must have shape (1, 3, 3) (one (d, d) value map a head, the output p',
     lambda: MultiHeadAttention(I3, I3, np.eye(4), 1.0)),
    ('DepthAttention period 0', 'range', ValueError, 'period (time each layer acts) must be > 0 and finite, got 0.0',
     lambda: DepthAttention(np.stack([I3, I3]), np.stack([I3, I3]), np.stack([I3, I3]), 1.0, 0.0)),
    ('DepthAttention period NaN', 'NaN/inf', ValueError, 'period (time each layer acts) must be > 0 and finite, got nan',
     lambda: DepthAttention(np.stack([I3, I3]), np.stack([I3, I3]), np.stack([I3, I3]), 1.0, np.nan)),
    ('NGPT alpha -1', 'range', ValueError, 'alpha (nGPT step size) must be > 0 and finite, got -1.0',
     lambda: NGPT(SA(), -1.0)),
    ('NGPT alpha NaN', 'NaN/inf', ValueError, 'alpha (nGPT step size) must be > 0 and finite, got nan',
     lambda: NGPT(SA(), np.nan)),
    ('layer_norm placement bogus', 'type', ValueError, "placement (norm) must be one of ('postln', 'preln', 'periln', 'ngpt'),",
     lambda: jaxdyn.layer_norm(SA(), "bogus")),
    ('Control t1 0', 'range', ValueError, 't1 (end of the control grid) must be > 0 and finite, got 0.0',
     lambda: models.Control(np.ones((4, 3)), 0.0)),
    ('Control kind bogus', 'type', ValueError, "Control kind must be 'piecewise' or 'linear', got 'bogus'",
     lambda: models.Control(np.ones((4, 3)), 1.0, kind="bogus")),
    ('stack_models not list', 'type', TypeError, 'stack_models takes a list of models, got a SphereAttention; pass [mode',
     lambda: jaxdyn.stack_models(SA())),
    ('redrawn_weights scale NaN', 'NaN/inf', ValueError, "redrawn_weights: spec['scale'] (the ensemble's scale) must be > 0 and ",
     lambda: redrawn_weights({"ensemble": "gaussian", "scale": np.nan}, 3, 2)),
    ('simulate t1 NaN', 'NaN/inf', ValueError, 't1 must be finite, got nan',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=np.nan, dt=0.1)),
    ('simulate dt 0', 'range', ValueError, 'dt (time step) must be > 0, got 0.0',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.0)),
    ('simulate dt -0.1', 'range', ValueError, 'dt (time step) must be > 0, got -0.1',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=-0.1)),
    ('simulate t1 < t0', 'range', ValueError, 't1 must be > t0, got t0=0.0, t1=-1.0',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=-1.0, dt=0.1)),
    ('simulate method bogus', 'type', ValueError, "method must be one of ('euler', 'rk4', 'exp_euler', 'euler_renormalise",
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.1, method="bogus")),
    ('simulate save_every 0', 'range', ValueError, 'save_every must be an integer >= 1 (steps between saves), got 0',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.1, save_every=0)),
    ('simulate save_every 2.5', 'type', ValueError, 'save_every must be an integer >= 1 (steps between saves), got 2.5',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.1, save_every=2.5)),
    ('simulate x0 wrong d', 'shape', ValueError, 'x0 must have shape (N, 3) with N >= 1 for this model, got (1, 2)',
     lambda: jaxdyn.simulate(SA(), np.array([[1.0, 0.0]]), t1=1.0, dt=0.1)),
    ('simulate x0 1-D', 'shape', ValueError, 'x0 must have shape (N, 3) with N >= 1 for this model, got (3,)',
     lambda: jaxdyn.simulate(SA(), np.array([1.0, 0, 0]), t1=1.0, dt=0.1)),
    ('simulate x0 empty', 'shape', ValueError, 'x0 must have shape (N, 3) with N >= 1 for this model, got (0, 3)',
     lambda: jaxdyn.simulate(SA(), np.zeros((0, 3)), t1=1.0, dt=0.1)),
    ('simulate max_steps 0', 'range', ValueError, 'max_steps must be an integer >= 1, got 0',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.1, method="dopri5", max_steps=0)),
    ('simulate saveat past t1', 'range', ValueError, 'saveat time 2.0 is not on the step grid t0 + k*dt (dt=0.1) within [t0,',
     lambda: jaxdyn.simulate(SA(), X3[:3], t1=1.0, dt=0.1, saveat=np.array([0.5, 2.0]))),
    ('simulate_sde sigma -1', 'range', ValueError, 'sigma (noise level) must be >= 0, got -1.0',
     lambda: jaxdyn.simulate_sde(SA(), X3[:3], KEY, sigma=-1.0, t1=1.0, dt=0.1)),
    ('simulate_sde sigma NaN', 'NaN/inf', ValueError, 'sigma (noise level) must be >= 0, got nan',
     lambda: jaxdyn.simulate_sde(SA(), X3[:3], KEY, sigma=np.nan, t1=1.0, dt=0.1)),
    ('simulate_ensemble empty list', 'shape', ValueError, 'simulate_ensemble takes a stacked SphereAttention or MultiHeadAttentio',
     lambda: jaxdyn.simulate_ensemble([], X3[:3], t1=1.0, dt=0.1)),
    ('cluster_count delta -1', 'range', ValueError, 'delta must be >= 0 and finite, got -1.0',
     lambda: clusters.cluster_count(X3, -1.0)),
    ('pair_fraction threshold NaN', 'NaN/inf', ValueError, 'threshold must be finite: 1 of its 1 entries are NaN or inf',
     lambda: clusters.pair_fraction(X3, np.nan)),
    ('gram 1-D', 'shape', ValueError, 'xs must have shape (..., N, d), got (3,)',
     lambda: clusters.gram(np.ones(3))),
    ('hitting_times levels NaN', 'NaN/inf', ValueError, 'levels must be finite: 1 of its 1 entries are NaN or inf',
     lambda: clusters.hitting_times(np.arange(3.0), np.array([3, 2, 1]), np.array([np.nan]))),
    ('merge_events ts decreasing', 'range', ValueError, 'ts must be strictly increasing',
     lambda: jaxdyn.merge_events(np.array([0.0, 2.0, 1.0]), np.array([3, 2, 1]))),
    ('merge_events ts NaN', 'NaN/inf', ValueError, 'ts must be finite: 1 of its 3 entries are NaN or inf',
     lambda: jaxdyn.merge_events(np.array([0.0, np.nan, 1.0]), np.array([3, 2, 1]))),
    ('interaction_energy B wrong shape', 'shape', ValueError, "B must have shape (d, d) or (..., d, d) with the clouds' d = 3, got sh",
     lambda: clusters.interaction_energy(X3, 1.0, B=np.eye(2))),
    ('CircleDensity m 4', 'range', ValueError, 'm (grid size) must be an integer >= 8, got 4',
     lambda: pde.CircleDensity(I2, I2, I2, 1.0, 4)),
    ('CircleDensity Q 3x3', 'shape', ValueError, 'Q must be a 2x2 matrix (the weights on the plane of S¹), got shape (3,',
     lambda: pde.CircleDensity(I3, I3, I3, 1.0, 16)),
    ('CircleDensity sigma -1', 'range', ValueError, 'sigma (noise) must be >= 0 and finite, got -1.0',
     lambda: pde.CircleDensity(I2, I2, I2, 1.0, 16, sigma=-1.0)),
    ('solve_density rho wrong length', 'shape', ValueError, "rho0 must have shape (16,) (the model's grid), got (8,)",
     lambda: pde.solve_density(CD(), np.ones(8), t1=0.1)),
    ('solve_density rho NaN', 'NaN/inf', ValueError, 'rho0 must be finite and >= 0 (cell averages of a density)',
     lambda: pde.solve_density(CD(), np.full(16, np.nan), t1=0.1)),
    ('solve_density t1 NaN', 'NaN/inf', ValueError, 't1 must be a number > 0, got nan',
     lambda: pde.solve_density(CD(), RHO16, t1=np.nan)),
    ('solve_density t1 -1', 'range', ValueError, 't1 must be a number > 0, got -1.0',
     lambda: pde.solve_density(CD(), RHO16, t1=-1.0)),
    ('solve_density method bogus', 'type', ValueError, "method must be one of ('heun', 'tsit5', 'dopri5'), got 'bogus'",
     lambda: pde.solve_density(CD(), RHO16, t1=0.1, method="bogus")),
    ('solve_density cfl -1', 'range', ValueError, 'cfl must be > 0, got -1.0',
     lambda: pde.solve_density(CD(), RHO16, t1=0.1, cfl=-1.0)),
    ('kde_circle bandwidth 0', 'range', ValueError, 'bandwidth must be a finite number > 0 (radians; for the cell counts use histogram_circle), got 0.0',
     lambda: pde.kde_circle(XC, 16, 0.0)),
    ('kde_circle bandwidth NaN', 'NaN/inf', ValueError, 'bandwidth must be a finite number > 0 (radians; for the cell counts use histogram_circle), got nan',
     lambda: pde.kde_circle(XC, 16, np.nan)),
    ('cfl_dt cfl 0', 'range', ValueError, 'cfl (the CFL number) must be > 0 and finite, got 0.0',
     lambda: pde.cfl_dt(CD(), 0.0)),
    ('cfl_dt cfl NaN', 'NaN/inf', ValueError, 'cfl (the CFL number) must be > 0 and finite, got nan',
     lambda: pde.cfl_dt(CD(), np.nan)),
    ('fourier_modes tol 0', 'range', ValueError, 'tol must lie in (0, 1), got 0.0',
     lambda: pde.fourier_modes(10.0, 0.0)),
    ('fourier_modes r_max NaN', 'NaN/inf', ValueError, 'r_max = β‖QᵀK‖₂ must be finite and >= 0, got nan',
     lambda: pde.fourier_modes(np.nan, 1e-6)),
    ('bessel_ive K -1', 'range', ValueError, 'K (the largest order) must be an integer >= 0, got -1',
     lambda: pde.bessel_ive(1.0, -1)),
    ('mode_amplitude k 2.5', 'type', ValueError, 'k (the mode) must be an integer >= 0, got 2.5',
     lambda: pde.mode_amplitude(RHO16, 2.5)),
    ('mode_amplitude rho NaN', 'NaN/inf', ValueError, 'rho must be finite: 16 of its 16 entries are NaN or inf',
     lambda: pde.mode_amplitude(np.full(16, np.nan), 1)),
    ('sphere_rates beta 0', 'range', ValueError, 'beta (inverse temperature) must be > 0 and finite, got 0.0',
     lambda: pde.sphere_rates(0.0, [1, 2])),
    ('sphere_rates sigma -1', 'range', ValueError, 'sigma (noise) must be >= 0 and finite, got -1.0',
     lambda: pde.sphere_rates(1.0, [1, 2], sigma=-1.0)),
    ('merge_times ts/rho mismatch', 'shape', ValueError, 'ts and rho_t must have the same length: ts has 3 entries, rho_t 5 (sha',
     lambda: pde.merge_times(np.arange(3.0), np.stack([RHO16] * 5))),
    ('circle_grid m 0', 'range', ValueError, 'm (number of cells) must be an integer >= 1, got 0',
     lambda: pde.circle_grid(0)),
    ('uniform_density m 2.5', 'type', ValueError, 'm (number of cells) must be an integer >= 1, got 2.5',
     lambda: pde.uniform_density(2.5)),
    ('histogram_circle m 2.5', 'type', ValueError, 'm (number of cells) must be an integer >= 1, got 2.5',
     lambda: pde.histogram_circle(XC, 2.5)),
    ('histogram_circle NaN cloud', 'NaN/inf', ValueError, 'x must be finite: it holds NaN or inf',
     lambda: pde.histogram_circle(np.full((3, 2), np.nan), 16)),
    ('w1_circle empty cloud', 'shape', ValueError, 'x must hold clouds of at least 1 point(s) of dimension d >= 1 (shape (',
     lambda: pde.w1_circle(RHO16, np.zeros((0, 2)))),
    ('SphereDensity beta -1', 'range', ValueError, 'beta (inverse temperature) must be > 0 and finite, got -1.0',
     lambda: pde.SphereDensity(I3, I3, I3, -1.0, 4, 8)),
    ('solve_moments S0 not PSD', 'range', ValueError, 'S0 must be positive semi-definite: min eigenvalue = -1.000e+00 (tolera',
     lambda: jaxdyn.solve_moments(None, -I2, A=I2, B=I2, V=I2, t1=1.0)),
    ('solve_moments S0 wrong d', 'shape', ValueError, 'S0 must have shape (2, 2) to match A, got (3, 3)',
     lambda: jaxdyn.solve_moments(None, I3, A=I2, B=I2, V=I2, t1=1.0)),
    ('solve_moments t1 NaN', 'NaN/inf', ValueError, 't1 must be > 0, got nan',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=np.nan)),
    ('solve_moments max_steps 0', 'range', ValueError, 'max_steps must be an integer >= 1, got 0',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, max_steps=0)),
    ('solve_moments blowup_threshold -1', 'range', ValueError, 'blowup_threshold must be > 1 and finite, got -1.0',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, blowup_threshold=-1.0)),
    ('solve_moments saveat past t1', 'range', ValueError, 'saveat times must lie in [0.0, 1.0], got [np.float64(0.5), np.float64(',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, saveat=np.array([0.5, 2.0]))),
    ('scalar_variance sigma0 -1', 'range', ValueError, 'sigma0 (the initial variance) must be >= 0 and finite, got -1.0',
     lambda: gaussian.scalar_variance(1.0, -1.0, 1.0, 1.0)),
    ('scalar_blowup_time NaN', 'NaN/inf', ValueError, 'sigma0 (the initial variance) must be >= 0 and finite, got nan',
     lambda: gaussian.scalar_blowup_time(np.nan, 1.0, 1.0)),
    ('gaussian_cloud n 0', 'range', ValueError, 'n (number of points) must be an integer >= 1, got 0',
     lambda: gaussian.gaussian_cloud(KEY, 0, np.zeros(2), I2)),
    ('gaussian_cloud S not PSD', 'range', ValueError, 'S must be positive semi-definite: min eigenvalue = -1.000e+00 (toleran',
     lambda: gaussian.gaussian_cloud(KEY, 8, np.zeros(2), -I2)),
    ('gaussian_cloud m wrong length', 'shape', ValueError, 'S must have shape (3, 3) to match m, got (2, 2)',
     lambda: gaussian.gaussian_cloud(KEY, 8, np.zeros(3), I2)),
    ('directions k 0', 'range', ValueError, 'k (number of directions) must be an integer >= 1, got 0',
     lambda: gaussian.directions(2, 0)),
    ('directions d 0', 'range', ValueError, 'd (the dimension) must be an integer >= 1, got 0',
     lambda: gaussian.directions(0, 4)),
    ('fit_slope mismatch', 'shape', ValueError, 'ns and errs must have the same length: ns has 3 entries, errs 2 (shape',
     lambda: gaussian.fit_slope(np.array([1.0, 2, 3]), np.array([1.0, 2]))),
    ('check_covariance NaN', 'NaN/inf', ValueError, 'S0 must be finite',
     lambda: gaussian.check_covariance(np.full((2, 2), np.nan))),
    ('classify A NaN', 'NaN/inf', ValueError, 'A must be finite: 4 of its 4 entries are NaN or inf',
     lambda: gaussian.classify(np.full((2, 2), np.nan), I2, I2)),
    ('lyapunov_solve NaN', 'NaN/inf', ValueError, 'A must be finite: 4 of its 4 entries are NaN or inf',
     lambda: gaussian.lyapunov_solve(np.full((2, 2), np.nan), I2)),
    ('stationary_covariance NaN', 'NaN/inf', ValueError, 'A must be finite: 4 of its 4 entries are NaN or inf',
     lambda: gaussian.stationary_covariance(np.full((2, 2), np.nan), I2, I2)),
    ('covariance_curves n_save 0', 'range', ValueError, 'saveat as a count must be >= 1, got 0',
     lambda: gaussian.covariance_curves(None, I2, A=I2, B=I2, V=I2, t1=1.0, n_save=0)),
    ('scalar_grid empty', 'shape', ValueError, 'a_values must hold at least one value, got an empty list',
     lambda: gaussian.scalar_grid([], [1.0], 1.0, t1=1.0)),
    ('reach t1 0', 'range', ValueError, 't1 must be > 0, got 0.0',
     lambda: jaxdyn.reach(None, I2, None, I2, t1=0.0)),
    ('reach n_pieces 0', 'range', ValueError, 'n_pieces must be an integer >= 1, got 0',
     lambda: jaxdyn.reach(None, I2, None, I2, n_pieces=0)),
    ('reach n_pieces 2.5', 'type', ValueError, 'n_pieces must be an integer >= 1, got 2.5',
     lambda: jaxdyn.reach(None, I2, None, I2, n_pieces=2.5)),
    ('reach unknown setting', 'type', TypeError, "reach() got unexpected keyword argument(s) ['bogus']; the settings are",
     lambda: jaxdyn.reach(None, I2, None, I2, bogus=1)),
    ('certificate S1 NaN', 'NaN/inf', ValueError, 'S1 must be finite',
     lambda: jaxdyn.certificate(None, I2, None, np.full((2, 2), np.nan))),
    ('random_target d 0', 'range', ValueError, 'd (the dimension) must be an integer >= 1, got 0',
     lambda: control.random_target(0, 0)),
    ('random_target eig_range reversed', 'range', ValueError, 'eig_range must be (low, high) with low <= high, got (4.0, 0.25)',
     lambda: control.random_target(0, 2, eig_range=(4.0, 0.25))),
    ('repeat_layers factor 0', 'range', ValueError, 'factor must be an integer >= 1, got 0',
     lambda: control.repeat_layers({"A": np.ones((2, 2, 2))}, 0)),
    ('default_controls model bogus', 'type', ValueError, "model must be one of ('sphere', 'euclidean'), got 'bogus'",
     lambda: control.default_controls("bogus", 2, 2)),
    ('default_controls n_layers 0', 'range', ValueError, 'd and n_layers must be >= 1, got d=2, n_layers=0',
     lambda: control.default_controls("euclidean", 2, 0)),
    ('numerical_rank NaN', 'NaN/inf', ValueError, 'S must be finite: 4 of its 4 entries are NaN or inf',
     lambda: control.numerical_rank(np.full((2, 2), np.nan))),
    ('measure_control n_layers 0', 'range', ValueError, 'n_layers must be an integer >= 1, got 0',
     lambda: control.measure_control(np.zeros((4, 2)), np.zeros((4, 2)), n_layers=0)),
    ('measure_control model bogus', 'type', ValueError, "model must be one of ('sphere', 'euclidean'), got 'bogus'",
     lambda: control.measure_control(np.zeros((4, 2)), np.zeros((4, 2)), n_layers=1, model="bogus")),
    ('measure_control epsilon -1', 'range', ValueError, 'epsilon must be > 0.0 and finite, got -1.0',
     lambda: control.measure_control(np.zeros((4, 2)), np.zeros((4, 2)), n_layers=1, epsilon=-1.0)),
    ('w2 method bogus', 'type', ValueError, "method must be 'exact', 'sinkhorn' or 'coupling', got 'bogus'",
     lambda: jaxdyn.w2(X3, X3, method="bogus")),
    ('w2_exact different n', 'shape', ValueError, 'x and y must have the same number of points for this method, got 4 and',
     lambda: jaxdyn.w2_exact(X3, X3[:3])),
    ('w2_exact d mismatch', 'shape', ValueError, 'x and y must live in the same dimension d, got x of shape (4, 3) and y',
     lambda: jaxdyn.w2_exact(X3, X3[:, :2])),
    ('w2_exact empty', 'shape', ValueError, 'x must hold at least one point, got shape (0, 3)',
     lambda: jaxdyn.w2_exact(np.zeros((0, 3)), np.zeros((0, 3)))),
    ('w2_sinkhorn epsilon -1', 'range', ValueError, 'epsilon must be a positive number (finite), got -1.0',
     lambda: jaxdyn.w2_sinkhorn(X3, X3, epsilon=-1.0)),
    ('w2_sinkhorn threshold 0', 'range', ValueError, 'threshold (the marginal tolerance) must be positive (a concrete number',
     lambda: jaxdyn.w2_sinkhorn(X3, X3, threshold=0.0)),
    ('w2_sinkhorn max_iterations 2.5', 'type', ValueError, 'max_iterations must be a positive integer, got 2.5',
     lambda: jaxdyn.w2_sinkhorn(X3, X3, max_iterations=2.5)),
    ('w2_sinkhorn rel_epsilon NaN', 'NaN/inf', ValueError, 'rel_epsilon must be a positive number (finite), got nan',
     lambda: jaxdyn.w2_sinkhorn(X3, X3, rel_epsilon=np.nan)),
    ('w2_coupling different n', 'shape', ValueError, 'x and y must be paired clouds with the same (N, d), got shapes (4, 3) ',
     lambda: distances.w2_coupling(X3, X3[:3])),
    ('bures_w2 S0 not PSD', 'range', ValueError, 'S0 must be positive semi-definite (a covariance): min eigenvalue = -1.',
     lambda: jaxdyn.bures_w2(np.zeros(2), -I2, np.zeros(2), I2)),
    ('bures_w2 m d mismatch', 'shape', ValueError, 'm0 must have shape (..., d) and S0 shape (..., d, d) with the same d, ',
     lambda: jaxdyn.bures_w2(np.zeros(3), I2, np.zeros(2), I2)),
    ('sqrtm_psd not square', 'shape', ValueError, 's must be square matrices of shape (..., d, d), got shape (2, 3)',
     lambda: distances.sqrtm_psd(np.ones((2, 3)))),
    ('gaussian_tokens batch 0', 'range', ValueError, 'batch must be an integer >= 1, got 0',
     lambda: encoder.gaussian_tokens(KEY, 0, 4, 8)),
    ('gaussian_tokens scale NaN', 'NaN/inf', ValueError, 'scale must be > 0 and finite, got nan',
     lambda: encoder.gaussian_tokens(KEY, 1, 4, 8, scale=np.nan)),
    ('nongaussian_stack kind bogus', 'type', ValueError, "kind must be one of ('cube', 'relu', 'split'), got 'bogus'",
     lambda: encoder.nongaussian_stack(np.ones((1, 4, 8)), KEY, kind="bogus")),
    ('check_assumptions NaN', 'NaN/inf', ValueError, 'Q has non-finite entries',
     lambda: jaxdyn.check_assumptions(np.full((3, 3), np.nan), I3, I3)),
    ('projection NaN V', 'NaN/inf', ValueError, 'V has non-finite entries',
     lambda: jaxdyn.projection(I3, I3, np.full((3, 3), np.nan))),
    ('spectral_weights mu NaN', 'NaN/inf', ValueError, 'mu (the eigenvalues of M) must be finite, got [1.0, nan, 0.0]',
     lambda: jaxdyn.spectral_weights(np.array([1.0, np.nan, 0.0]))),
    ('rotation_matrix plane out of range', 'range', ValueError, 'plane must be two distinct indices in [0, 3), got (0, 5)',
     lambda: spectral.rotation_matrix(3, 0.1, plane=(0, 5))),
    ('simulate_ensemble chunk 0', 'range', ValueError, 'chunk must be a positive integer or None, got 0',
     lambda: jaxdyn.simulate_ensemble(jaxdyn.stack_models([SA(), SA()]), np.stack([X3, X3]), t1=1.0, dt=0.1, chunk=0)),
    ('BertConfig heads do not divide d', 'range', ValueError, 'hidden_size (10) must be a multiple of num_attention_heads (3)',
     lambda: encoder.BertConfig(**{**BERT, "hidden_size": 10, "num_attention_heads": 3})),
    ('BertConfig hidden_size 0', 'range', ValueError, 'hidden_size must be >= 1, got 0',
     lambda: encoder.BertConfig(**{**BERT, "hidden_size": 0})),
    ('BertConfig layer_norm_eps -1', 'range', ValueError, 'layer_norm_eps must be a finite number > 0, got -1.0',
     lambda: encoder.BertConfig(**BERT, layer_norm_eps=-1.0)),
    ('BertConfig hidden_act bogus', 'type', ValueError, "hidden_act must be one of",
     lambda: encoder.BertConfig(**BERT, hidden_act="bogus")),
    ('nongaussian_stack n_layers -1', 'range', ValueError, 'n_layers must be an integer >= 0, got -1',
     lambda: encoder.nongaussian_stack(np.ones((1, 4, 8)), KEY, n_layers=-1)),
    ('span_dimension rtol -1', 'range', ValueError, 'rtol must be >= 0 and finite, got -1.0',
     lambda: clusters.span_dimension(X3, -1.0)),
    ('interaction_energy beta 0', 'range', ValueError, 'beta must be > 0 and finite, got 0.0',
     lambda: clusters.interaction_energy(X3, 0.0)),
    ('log_partition_energy beta -1', 'range', ValueError, 'beta must be > 0 and finite, got -1.0',
     lambda: clusters.log_partition_energy(X3, -1.0)),
    ('cluster_labels delta inf', 'NaN/inf', ValueError, 'delta must be finite',
     lambda: clusters.cluster_labels(X3, np.inf)),
    ('merge_events counts NaN', 'NaN/inf', ValueError, 'counts must be finite',
     lambda: jaxdyn.merge_events(np.array([0.0, 1.0, 2.0]), np.array([3, np.nan, 1]))),
    ('first_clusters ts/rho mismatch', 'shape', ValueError, 'ts and rho_t must have the same length: ts has 3 entries, rho_t 5',
     lambda: pde.first_clusters(np.arange(3.0), np.stack([RHO16] * 5))),
    ('merge_times ts NaN', 'NaN/inf', ValueError, 'ts must be finite',
     lambda: pde.merge_times(np.array([0.0, np.nan]), np.stack([RHO16] * 2))),
    ('sphere_cfl_dt cfl NaN', 'NaN/inf', ValueError, 'cfl (the CFL number) must be > 0 and finite, got nan',
     lambda: pde.sphere_cfl_dt(pde.SphereDensity(I3, I3, I3, 1.0, 4, 8), np.nan)),
    ('bessel_ive r -1', 'range', ValueError, 'r must be >= 0 and finite, got -1.0',
     lambda: pde.bessel_ive(-1.0, 3)),
    ('bessel_ive extra 2.5', 'type', ValueError, 'extra must be an integer >= 0, got 2.5',
     lambda: pde.bessel_ive(1.0, 3, 2.5)),
    ('mode_amplitude k past M/2', 'range', ValueError, 'k must lie in [0, M/2] = [0, 8]',
     lambda: pde.mode_amplitude(RHO16, 9)),
    ('sphere_rates ls -1', 'range', ValueError, 'ls (the degrees) must be >= 0 and finite, got -1.0',
     lambda: pde.sphere_rates(1.0, [-1, 2])),
    ('solve_moments rtol -1', 'range', ValueError, 'rtol must be >= 0 and finite, got -1.0',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, rtol=-1.0)),
    ('solve_moments atol NaN', 'NaN/inf', ValueError, 'atol must be >= 0 and finite, got nan',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, atol=np.nan)),
    ('solve_moments max_steps 2.5', 'type', ValueError, 'max_steps must be an integer >= 1, got 2.5',
     lambda: jaxdyn.solve_moments(None, I2, A=I2, B=I2, V=I2, t1=1.0, max_steps=2.5)),
    ('solve_moments_batch max_explicit_iterations 0', 'range', ValueError, 'max_explicit_iterations must be an integer >= 1, got 0',
     lambda: jaxdyn.solve_moments_batch(None, I2, A=I2, B=I2, V=I2, t1=1.0, max_explicit_iterations=0)),
    ('solve_moments_batch blowup_threshold 1', 'range', ValueError, 'blowup_threshold must be > 1 and finite, got 1.0',
     lambda: jaxdyn.solve_moments_batch(None, I2, A=I2, B=I2, V=I2, t1=1.0, blowup_threshold=1.0)),
    ('stationary_covariance newton_iters 0', 'range', ValueError, 'newton_iters must be an integer >= 1, got 0',
     lambda: gaussian.stationary_covariance(I2, I2, -I2, newton_iters=0)),
    ('classify S0 wrong d', 'shape', ValueError, 'S0 must be a square matrix of shape (2, 2), got shape (3, 3)',
     lambda: gaussian.classify(I2, I2, I2, I3)),
    ('lyapunov_solve Q wrong d', 'shape', ValueError, 'Q must be a square matrix of shape (2, 2), got shape (3, 3)',
     lambda: gaussian.lyapunov_solve(I2, I3)),
    ('scalar_variance t NaN', 'NaN/inf', ValueError, 't must be finite',
     lambda: gaussian.scalar_variance(np.nan, 1.0, 1.0, 1.0)),
    ('gaussian_cloud m NaN', 'NaN/inf', ValueError, 'm must be finite',
     lambda: gaussian.gaussian_cloud(0, 8, np.array([np.nan, 0.0]), I2)),
    ('random_target rank > d', 'range', ValueError, 'rank must be an integer in [0, d] = [0, 2], got 3',
     lambda: control.random_target(0, 2, rank=3)),
    ('random_target eig_range 0', 'range', ValueError, 'eig_range must be > 0 and finite, got 0.0',
     lambda: control.random_target(0, 2, eig_range=(0.0, 1.0))),
    ('numerical_rank rank_rtol -1', 'range', ValueError, 'rank_rtol must be >= 0 and finite, got -1.0',
     lambda: control.numerical_rank(I2, -1.0)),
    ('numerical_rank not square', 'shape', ValueError, 'S must be a square matrix of shape (d, d), got shape (2, 3)',
     lambda: control.numerical_rank(np.ones((2, 3)))),
    ('cloud_w2_to_gaussian S1 NaN', 'NaN/inf', ValueError, 'S1 must be finite',
     lambda: control.cloud_w2_to_gaussian(np.zeros((4, 2)), np.zeros(2), np.full((2, 2), np.nan))),
    ('bures_w2_squared S1 asymmetric', 'range', ValueError, 'S1 must be symmetric (a covariance)',
     lambda: distances.bures_w2_squared(np.zeros(2), I2, np.zeros(2), np.array([[1.0, 0.5], [0.0, 1.0]]))),
    ('trace_sqrtm_psd 1-D', 'shape', ValueError, 'c must be square matrices of shape (..., d, d), got shape (3,)',
     lambda: distances.trace_sqrtm_psd(np.ones(3))),
    ('gaussian_tokens seq 2.5', 'type', ValueError, 'seq must be an integer >= 1, got 2.5',
     lambda: encoder.gaussian_tokens(KEY, 1, 2.5, 8)),
    ('redrawn_weights scale -1', 'range', ValueError, "redrawn_weights: spec['scale'] (the ensemble's scale) must be > 0",
     lambda: redrawn_weights({"ensemble": "gaussian", "scale": -1.0}, 3, 2)),
    ('mass_near angle -1', 'range', ValueError, 'angle (radians) must be >= 0.0 and <= 1.57',
     lambda: spectral.mass_near(X3, I3[:, :1], -1.0)),
    ('mass_near angle NaN', 'NaN/inf', ValueError, 'angle (radians) must be >= 0.0 and <= 1.57',
     lambda: spectral.mass_near(X3, I3[:, :1], float("nan"))),
    ('lyapunov P_E of another d', 'shape', ValueError, 'P_E is a (2, 2) projector but the points x have shape (4, 3)',
     lambda: spectral.lyapunov(X3, I2)),
    ('build_weights scale -1', 'range', ValueError, "config field 'weights.scale' must be a finite number > 0, got -1.0",
     lambda: build_weights({"ensemble": "gaussian", "scale": -1.0}, 3)),
    ('build_weights scale NaN', 'NaN/inf', ValueError, "config field 'weights.scale' must be a finite number > 0, got nan",
     lambda: build_weights({"ensemble": "gaussian", "scale": float("nan")}, 3)),
    ('default_batch_size n 0', 'range', ValueError, 'n (points of the first cloud) must be an integer >= 1, got 0',
     lambda: distances.default_batch_size(0, 4)),
    ('redrawn_weights ensemble bogus', 'type', ValueError, "config field 'weights.ensemble': unknown ensemble 'bogus'",
     lambda: redrawn_weights({"ensemble": "bogus"}, 3, 2)),
]


@pytest.mark.parametrize("case,cls,exc,needle,call", LIBRARY, ids=[c[0] for c in LIBRARY])
def test_library_refuses(case, cls, exc, needle, call):
    """Each bad argument is a ValueError/TypeError whose message names it and the problem."""
    with pytest.raises(exc, match=re.escape(needle)):
        call()


# ------------------------------------------------------------------ documented meanings

ACCEPTED = {
    # the ensemble's default scale, 1
    "redrawn_weights without scale": lambda: [np.testing.assert_array_equal(a, b) for a, b in zip(
        redrawn_weights({"ensemble": "gaussian"}, 3, 2),
        redrawn_weights({"ensemble": "gaussian", "scale": 1.0}, 3, 2))],
    # W1 between densities on different grids (the grids may differ)
    "w1_circle_densities of two grids": lambda: math.isclose(
        pde.w1_circle_densities(np.full(16, 1 / (2 * math.pi)), np.full(8, 1 / (2 * math.pi))),
        0.0, abs_tol=1e-12) or pytest.fail("W1 of two uniform densities"),
    # non-positive errors are left out of the fit: the slope of the two others
    "fit_slope with a negative error": lambda: math.isclose(
        gaussian.fit_slope([1.0, 2.0, 4.0], [1.0, -1.0, 0.25]), -1.0) or pytest.fail("slope"),
    # no points, no modes: empty answers of the right shape
    "quantile_points n 0": lambda: np.shape(pde.quantile_points(RHO16, 0))[0] == 0 or pytest.fail("n 0"),
    "linear_rates of no mode": lambda: np.shape(pde.linear_rates(1.0, [])) == (0,) or pytest.fail("ks"),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_documented_meaning(case):
    """Inputs that look hostile but have a documented meaning give that meaning."""
    ACCEPTED[case]()


# ------------------------------------------------------------------ traced values out of range

@pytest.mark.slow  # the same five parameters under vmap, one entry each: tests/test_traced_domains.py (cluster_count delta, interaction_energy beta, cfl_dt cfl, scalar_variance sigma0, mass_near angle); not in the default suite: β = 0 and an angle past π/2
def test_traced_parameters_out_of_range_are_flagged():
    """Under vmap a traced value out of its range gives −1 / NaN for its member only.

    δ < 0 (cluster count), β ≤ 0 (energy), cfl ≤ 0 (the CFL step), σ0 < 0 (the scalar law), an
    angle outside [0, π/2] or NaN (the mass near a subspace).
    """
    def stats(delta, beta, cfl, sigma0, angle):
        return (clusters.cluster_count(X3, delta), clusters.interaction_energy(X3, beta),
                pde.cfl_dt(CD(), cfl), gaussian.scalar_variance(0.5, sigma0, 1.0, 1.0),
                spectral.mass_near(X3, I3[:, :1], angle))

    n, e, dt, var, mass = (np.asarray(a) for a in jax.vmap(stats)(
        jnp.array([1e-4, -1.0, 1e-4, 1e-4]), jnp.array([1.0, 1.0, 0.0, 1.0]),
        jnp.array([0.9, 0.9, 0.9, -1.0]), jnp.array([0.1, 0.1, 0.1, -0.1]),
        jnp.array([0.1, -1.0, jnp.nan, 2.0])))
    assert mass[0] == 0.25 and np.isnan(mass[1:]).all()
    assert n.tolist() == [4, -1, 4, 4]
    assert np.isfinite(e[[0, 1, 3]]).all() and e[0] == e[1] == e[3] and np.isnan(e[2])
    assert dt[0] == dt[1] == dt[2] > 0 and np.isnan(dt[3])
    assert var[0] == var[1] == var[2] > 0 and np.isnan(var[3])


# ------------------------------------------------------------------ the CLI: jaxdyn config

SPH = {"kind": "sphere", "name": "t", "d": 3, "n": 48, "t1": 1.0, "dt": 0.1, "save_every": 2,
       "sweep": {"beta": [1.0]}}
CONC = {"kind": "concentration", "name": "c", "d": 3, "n": 64, "t1": 1.0, "dt": 0.1,
        "save_every": 2, "sweep": {"beta": [10.0]}}
GAU = {"kind": "gaussian", "name": "g", "study": "trajectory", "d": 2, "t1": 1.0, "dt": 0.1,
       "save_every": 2, "sweep": {"n": [100]}}
REA = {"kind": "reachability", "name": "r", "d": 2, "t1": 1.0, "n_pieces": 4}
PDE = {"kind": "pde", "name": "p", "mode": "clusters", "m": 64, "t1": 2.0, "n_save": 5,
       "sweep": {"beta": [2.0]}}
VAR = {"kind": "variants", "name": "v", "d": 3, "n": 32, "t1": 1.0, "dt": 0.1, "save_every": 1}
CTL = {"kind": "control", "name": "k", "problem": "sphere_clusters", "n_particles": 16, "t1": 1.0}
GSN = {"kind": "gaussianity", "name": "gs", "architecture": "deit", "batch": 2, "seq": 8,
       "sweep": {"model": ["random"]}}

# (case, config, the error line after "jaxdyn: error: ")
CONFIGS = [
    ('sphere n string', {**SPH, "n": "many"},
     "config field 'n': expected an integer (number of particles N >= 1), got 'many'"),
    ('sphere n 0', {**SPH, "n": 0},
     "config field 'n': must be >= 1, got 0"),
    ('sphere n 2.5', {**SPH, "n": 2.5},
     "config field 'n': expected an integer (number of particles N >= 1), got 2.5"),
    ('sphere n bool', {**SPH, "n": True},
     "config field 'n': expected an integer (number of particles N >= 1), got True"),
    ('sphere d 1', {**SPH, "d": 1},
     "config field 'd': must be >= 2, got 1"),
    ('sphere dt inf', {**SPH, "dt": float("inf")},
     "config field 'dt': must be finite, got inf"),
    ('sphere dt negative', {**SPH, "dt": -0.1},
     "config field 'dt': must be > 0, got -0.1"),
    ('sphere t1 0', {**SPH, "t1": 0.0},
     "config field 't1': must be > 0, got 0.0"),
    ('sphere sweep empty list', {**SPH, "sweep": {"beta": []}},
     "config field 'sweep.beta': expected a non-empty list of values, got []"),
    ('sphere sweep unknown field', {**SPH, "sweep": {"colour": [1, 2]}},
     "config field 'sweep.colour': cannot sweep over 'colour'; sweepable fields: atten"),
    ('sphere beta negative', {**SPH, "sweep": {"beta": [-1.0]}},
     "config field 'sweep.beta[0]': must be > 0, got -1.0"),
    ('sphere method bogus', {**SPH, "method": "bogus"},
     "config field 'method': must be one of ['euler', 'rk4', 'exp_euler', 'euler_renor"),
    ('sphere dtype bogus', {**SPH, "dtype": "float17"},
     "config field 'dtype': must be one of ['float32', 'float64'], got 'float17'"),
    ('sphere init dist bogus', {**SPH, "init": {"dist": "bogus"}},
     "config field 'init.dist': must be one of ['uniform', 'vmf', 'mixture'], got 'bog"),
    ('sphere init kappa NaN', {**SPH, "init": {"dist": "vmf", "kappa": float("nan")}},
     "config field 'init.kappa': must be finite, got nan"),
    ('sphere weights scale negative', {**SPH, "weights": {"ensemble": "gaussian", "scale": -1.0}},
     "config field 'weights.scale': must be > 0, got -1.0"),
    ('sphere weights scale NaN', {**SPH, "weights": {"ensemble": "gaussian", "scale": float("nan")}},
     "config field 'weights.scale': must be finite, got nan"),
    ('sphere field of pde (m)', {**SPH, "m": 64},
     "unknown config field 'm'; every field of kind 'sphere': `jaxdyn kinds sphere`"),
    ('sphere save_every 0', {**SPH, "save_every": 0},
     "config field 'save_every': must be >= 1, got 0"),
    ('sphere chunk_size string', {**SPH, "chunk_size": "x"},
     "config field 'chunk_size': expected an integer (points per chunk (0 = automatic "),
    ('sphere name empty', {**SPH, "name": ""},
     "config field 'name': must be a plain file name (no '/', no leading '.', at most "),
    ('sphere weights not a map', {**SPH, "weights": [1, 2]},
     "config field 'weights': expected a mapping (Q, K, V ensemble), got [1, 2]"),
    ('concentration near_angle negative', {**CONC, "near_angle_deg": -3.0},
     "config field 'near_angle_deg': must be > 0, got -3.0"),
    ('concentration w2_methods bogus', {**CONC, "w2_methods": ["bogus"]},
     "config field 'w2_methods': expected a non-empty subset of ['exact', 'sinkhorn', "),
    ('concentration w2_methods empty', {**CONC, "w2_methods": []},
     "config field 'w2_methods': expected a non-empty subset of ['exact', 'sinkhorn', "),
    ('gaussian study bogus', {**GAU, "study": "bogus"},
     "config field 'study': must be one of ['trajectory', 'phase_diagram'], got 'bogus"),
    ('gaussian S0 not PSD', {**GAU, "S0": [[-1.0, 0.0], [0.0, 1.0]]},
     "config field 'S0': must be positive semi-definite, min eigenvalue = -1"),
    ('gaussian A wrong shape', {**GAU, "A": [[1.0, 0.0, 0.0]]},
     "config field 'A': expected a 2×2 matrix (d = 2), got 1×3"),
    ('gaussian A NaN', {**GAU, "A": [[float("nan"), 0.0], [0.0, 1.0]]},
     "config field 'A[0][0]': must be finite, got nan"),
    ('gaussian sweep n 0', {**GAU, "sweep": {"n": [0]}},
     "config field 'sweep.n[0]': must be >= 2, got 0"),
    ('gaussian snapshot_particles -1', {**GAU, "snapshot_particles": -1},
     "config field 'snapshot_particles': must be >= 1, got -1"),
    ('gaussian field of sphere (beta)', {**GAU, "beta": 1.0},
     "unknown config field 'beta'; every field of kind 'gaussian': `jaxdyn kinds gaussi"),
    ('reach n_pieces 0', {**REA, "n_pieces": 0},
     "config field 'n_pieces': must be >= 1, got 0"),
    ('reach bound negative', {**REA, "bound": -0.5},
     "config field 'bound': must be > 0, got -0.5"),
    ('reach tol NaN', {**REA, "tol": float("nan")},
     "config field 'tol': must be finite, got nan"),
    ('reach target eig_min > eig_max', {**REA, "target": {"eig_min": 4.0, "eig_max": 0.25}},
     "config field 'target.eig_min': must be <= target.eig_max, got 4.0 > 0.25"),
    ('reach sweep mode bogus', {**REA, "sweep": {"mode": ["bogus"]}},
     "config field 'sweep.mode[0]': must be one of ['all', 'attention', 'bounded', 'en"),
    ('reach lbfgs_steps -1', {**REA, "lbfgs_steps": -1},
     "config field 'lbfgs_steps': must be >= 0, got -1"),
    ('reach m0 string', {**REA, "m0": "x"},
     "config field 'm0': expected a number, a list of d numbers or null, got 'x'"),
    ('pde mode bogus', {**PDE, "mode": "bogus"},
     "config field 'mode': must be one of ['clusters', 'particles', 's2'], got 'bogus'"),
    ('pde m 2.5', {**PDE, "m": 2.5},
     "config field 'm': expected an integer (grid cells M on S¹), got 2.5"),
    ('pde n_save 0', {**PDE, "n_save": 0},
     "config field 'n_save': must be >= 2, got 0"),
    ('pde sigma negative', {**PDE, "sigma": -1.0},
     "config field 'sigma': must be >= 0, got -1.0"),
    ('pde sigma inf', {**PDE, "sigma": float("inf")},
     "config field 'sigma': must be finite, got inf"),
    ('pde eps 0', {**PDE, "eps": 0.0},
     "config field 'eps': must be > 0, got 0.0"),
    ('pde sweep beta 0', {**PDE, "sweep": {"beta": [0.0]}},
     "config field 'sweep.beta[0]': must be > 0, got 0.0"),
    ('pde field of sphere (n)', {**PDE, "n": 48},
     "unknown config field 'n'; every field of kind 'pde': `jaxdyn kinds pde` (or docs"),
    ('variants norm bogus', {**VAR, "sweep": {"norm": ["bogus"]}},
     "config field 'sweep.norm[0]': must be one of ['postln', 'preln', 'periln', 'ngpt"),
    ('variants heads 0', {**VAR, "heads": 0},
     "unknown config field 'heads'; did you mean 'head'?; every field of kind 'variant"),
    ('variants depth period 0', {**VAR, "depth": {"source": "random", "period": 0.0}},
     "config field 'depth.source': must be one of ['constant', 'redraw', 'minilm'], go"),
    ('control problem bogus', {**CTL, "problem": "bogus"},
     "config field 'problem': must be one of ['gaussian_to_mixture', 'sphere_clusters'"),
    ('control max_layers 0', {**CTL, "max_layers": 0},
     "config field 'max_layers': must be >= 1, got 0"),
    ('control epsilon negative', {**CTL, "epsilon": -0.01},
     "config field 'epsilon': must be > 0, got -0.01"),
    ('control adam_lr NaN', {**CTL, "adam_lr": float("nan")},
     "config field 'adam_lr': must be finite, got nan"),
    ('control n_particles 1', {**CTL, "n_particles": 1},
     "config field 'n_particles': must be >= 2, got 1"),
    ('control sweep n_layers > max_layers', {**CTL, "max_layers": 4, "sweep": {"n_layers": [8]}},
     "config field 'max_layers': must be >= every n_layers (8), got 4"),
    ('gaussianity architecture bogus', {**GSN, "architecture": "bogus"},
     "config field 'architecture': must be one of ['bert', 'modernbert', 'deit'], got "),
    ('gaussianity batch 0', {**GSN, "batch": 0},
     "config field 'batch': must be >= 1, got 0"),
    ('gaussianity seq -1', {**GSN, "seq": -1},
     "config field 'seq': must be >= 2, got -1"),
    ('gaussianity scale NaN', {**GSN, "sweep": {"model": ["random"], "scale": [float("nan")]}},
     "config field 'sweep.scale[0]': must be finite, got nan"),
    ('variants depth period 0 (constant)', {**VAR, "depth": {"source": "constant", "period": 0.0}},
     "config field 'depth.period': must be > 0, got 0.0"),
    ('variants depth period NaN', {**VAR, "depth": {"source": "redraw", "period": float("nan")}},
     "config field 'depth.period': must be finite, got nan"),
    ('sphere weights scale 0', {**SPH, "weights": {"ensemble": "gaussian", "scale": 0.0}},
     "config field 'weights.scale': must be > 0, got 0.0"),
    ('sphere sweep beta string', {**SPH, "sweep": {"beta": ["hot"]}},
     "config field 'sweep.beta[0]': expected a number (inverse temperature β > 0), got"),
    ('sphere sweep n 2.5', {**SPH, "sweep": {"n": [48, 2.5]}},
     "config field 'sweep.n[1]': expected an integer (number of particles N >= 1), got"),
    ('sphere weights explicit Q wrong shape', {**SPH, "weights": {"ensemble": "explicit", "Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1]], "V": [[1, 0], [0, 1]]}},
     "config field 'weights.Q': expected a 3×3 matrix (d = 3), got shape (2, 2)"),
    ('sphere weights explicit Q NaN', {**SPH, "weights": {"ensemble": "explicit", "Q": [[float("nan"), 0, 0], [0, 1, 0], [0, 0, 1]], "K": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], "V": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}},
     "config field 'weights.Q[0][0]': must be finite, got nan"),
    ('sphere weights unknown key', {**SPH, "weights": {"ensemble": "gaussian", "colour": 1}},
     "unknown config field 'weights.colour'; known fields here: K, Q, V, eigenspace_an"),
    ('concentration weights spectral mu empty', {**CONC, "weights": {"ensemble": "spectral", "mu": []}},
     "config field 'weights.mu': expected 3 eigenvalues (d = 3), got 0"),
    ('pde particles times past t1', {**PDE, "mode": "particles"},
     "config field 'particles.times': every time must lie in [0, t1 = 2.0]"),
    ('control target clusters 0', {**CTL, "target": {"clusters": 0}},
     "config field 'target.clusters': must be >= 1, got 0"),
    ('control target kappa NaN', {**CTL, "target": {"kappa": float("nan")}},
     "config field 'target.kappa': must be finite, got nan"),
    ('gaussian sweep seed negative', {**GAU, "sweep": {"n": [100], "seed": [-1]}},
     "config field 'sweep.seed[0]': a seed must be in [0, 2**32), got -1"),
    ('reach transfer n_particles 1', {**REA, "transfer": {"n_particles": [1]}},
     "config field 'transfer.n_particles': every N must be >= 2, got [1]"),
    ('sphere memory_budget_gb negative', {**SPH, "memory_budget_gb": -1.0},
     "config field 'memory_budget_gb': must be >= 0, got -1.0"),
    ('kind bogus', {**SPH, "kind": "bogus"},
     "config field 'kind': unknown experiment kind 'bogus'; known kinds: concentration"),
    ('kind number', {**SPH, "kind": 3},
     "config field 'kind': unknown experiment kind 3; known kinds: concentration, cont"),
    ('sphere snapshots empty', {**SPH, "snapshots": []},
     "config field 'snapshots': expected a non-empty list, got []"),
    ('sphere pair_threshold 2', {**SPH, "pair_threshold": 2.0},
     "config field 'pair_threshold': must lie in [-1, 1] (an inner product of unit vectors), got 2.0"),
    ('sphere gram_threshold -2', {**SPH, "gram_threshold": -2.0},
     "config field 'gram_threshold': must lie in [-1, 1]"),
    ('pde particles n empty', {**PDE, "mode": "particles", "t1": 4.0, "particles": {"n": []}},
     "config field 'particles.n': expected a non-empty list of values > 0, got []"),
    ('pde particles repeats empty', {**PDE, "mode": "particles", "t1": 4.0, "particles": {"repeats": []}},
     "config field 'particles.repeats': expected a non-empty list of values > 0, got []"),
    ('pde particles n 0', {**PDE, "mode": "particles", "t1": 4.0, "particles": {"n": [100, 0]}},
     "config field 'particles.n': every value must be > 0, got [100, 0]"),
    ('sphere snapshots NaN', {**SPH, "snapshots": [float("nan")]},
     "config field 'snapshots[0]': must be finite, got nan"),
]


@pytest.mark.parametrize("case,cfg,needle", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_config_refused(tmp_path, capsys, case, cfg, needle):
    """``jaxdyn config`` exits 2 with one line naming the field and the problem."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert cli.main(["config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxdyn: error: "), err
    assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("argv,needle", [
    (["kinds", "bogus"], "unknown experiment kind 'bogus'"),
    (["report", "{tmp}/nonexistent"], "no such folder"),
    (["run", "{tmp}/missing.yaml"], "config file not found"),
    (["report", "{tmp}"], "holds no config.yaml: not a jaxdyn run folder"),
], ids=["kinds", "report-missing", "run-missing", "report-not-a-run"])
def test_cli_commands_refused(tmp_path, capsys, argv, needle):
    """Bad arguments to ``kinds``, ``report`` and ``run`` exit 2 with one named line."""
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_shared_checks_take_small_float_dtypes():
    """bfloat16 values are numbers to the shared checks: finite ones pass, NaN and ranges are named."""
    from jaxdyn._checks import check_bounds, check_finite

    check_finite("x", jnp.ones(3, jnp.bfloat16))
    check_bounds("delta", jnp.asarray(0.5, jnp.bfloat16), low=0)
    with pytest.raises(ValueError, match="x must be finite: 1 of its 2 entries"):
        check_finite("x", jnp.asarray([1.0, jnp.nan], jnp.bfloat16))
    with pytest.raises(ValueError, match="delta must be >= 0 and finite, got -1.0"):
        check_bounds("delta", jnp.asarray(-1.0, jnp.bfloat16), low=0)
    with pytest.raises(ValueError, match="must be a real number, got True"):
        check_bounds("delta", True, low=0)


@pytest.mark.slow  # one solve_moments program (Dopri8 and the pole refinement): seconds to compile
def test_solve_moments_flags_traced_times_out_of_range():
    """Traced times out of range are invalid_input for their member only.

    Under vmap: t1 ≤ 0, t1 NaN, save times past t1; in a bounded number of steps, while the
    valid member keeps its solve.
    """
    def solve(t1, last):
        return jaxdyn.solve_moments(None, I2, A=-I2, B=0 * I2, V=I2, t1=t1,
                                    saveat=jnp.stack([0.5 * last, last]))

    t1 = jnp.array([1.0, -1.0, jnp.nan, 0.7])
    last = jnp.array([1.0, -1.0, 1.0, 1.0])  # member 3: save times past its t1
    sol = jax.vmap(solve)(t1, last)
    assert list(jaxdyn.status_names(sol.result)) == ["successful"] + 3 * ["invalid_input"]
    assert int(np.max(np.asarray(sol.num_steps))) < 1000
    ref = jaxdyn.solve_moments(None, I2, A=-I2, B=0 * I2, V=I2, t1=1.0, saveat=np.array([0.5, 1.0]))
    np.testing.assert_allclose(np.asarray(sol.cov[0]), np.asarray(ref.cov), rtol=1e-6)
