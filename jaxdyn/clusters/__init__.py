"""Cluster statistics of particle clouds and of densities (docs/math.md §F).

Every function takes clouds ``xs`` of shape (..., N, d) — one cloud, a trajectory's saved
frames (S, N, d), an ensemble (B, S, N, d) — and returns one value per cloud (shape ``...``,
or ``(..., N)`` / ``(..., N, d)`` for per-cluster arrays). Parameters (``beta``, ``B``,
thresholds) broadcast against the leading axes: a β per system is ``beta`` of shape (B, 1)
against frames (B, S, N, d). Every statistic is a fixed-shape array computation that runs under
``jax.jit`` and ``jax.vmap`` with traced clouds and parameters (the component labelling is a
fixed number of boolean squarings, or a ``lax.while_loop`` to a fixed point), and lowers for
accelerators; ``jax.grad`` flows through the energies. The one exception is
:func:`merge_events`: its output has as many entries as there are merges (a data-dependent
length), so it runs on the host in NumPy; :func:`hitting_times` is its fixed-shape, traceable
counterpart.

**Input checks.** Bad input gives no plausible number: clouds must be (..., N, d) with at
least one point of dimension d ≥ 1 (a ValueError naming ``xs`` otherwise); a concrete cloud
or parameter that holds NaN or inf is refused on the host (a ValueError naming it, and the
first such cloud), and so is a concrete δ < 0, β ≤ 0, rtol < 0 or a B that is not (d, d);
under ``jax.jit`` or ``jax.vmap`` a non-finite cloud or parameter (or a traced δ, β or rtol out
of that range) makes its own values NaN (the floating statistics) or −1 (the integer ones:
counts, ranks, labels), never a count or a fraction.

Graph and pair conventions (stated once, used everywhere):

* **pair fraction** ``pair_fraction(xs, threshold)``: the fraction of *unordered* pairs
  {i, j}, i < j, with ⟨x_i, x_j⟩ > threshold, i.e. #{i < j : ⟨x_i, x_j⟩ > threshold} /
  (N(N−1)/2). Because ⟨x_i, x_j⟩ = ⟨x_j, x_i⟩ this is also the fraction of ordered pairs
  i ≠ j. ``include_self=True`` counts the N diagonal pairs too, over N² ordered pairs
  (``(2·count + N)/N²``), the convention of a plain ``mean(G > threshold)``.
* **cluster count** ``cluster_count(xs, delta)``: the number of connected components of the
  graph on the particles with an edge i ~ j when ⟨x_i, x_j⟩ > 1 − δ (each particle is in its
  own component at least). On a cloud made of tight, well-separated clusters this is the
  number of clusters; it is invariant to permuting the particles. δ broadcasts against the
  clouds' leading axes and defaults to 10⁻⁴ in every function of this graph
  (:func:`cluster_labels`, :func:`cluster_count`, :func:`cluster_masses`,
  :func:`cluster_centres`): the ``cluster_delta`` of the experiments' ``sphere`` kind.
* **Gram rank** ``gram_rank(xs, threshold)``: the numerical rank of the 0/1 matrix
  A_ij = 1[⟨x_i, x_j⟩ > threshold] (the published count of the rotf scripts, threshold
  0.9999). When the graph is a disjoint union of cliques (after a permutation A is
  block-diagonal with all-ones blocks) the rank equals the number of components; otherwise
  it may differ (a chain i ~ j ~ k with i ≁ k is one component of rank up to 3).

The package holds every cluster reading: ``_particles.py`` (the statistics of particle clouds
above, the names of this module) and ``_density.py`` (the clusters of a density on a grid of
S¹: counts, first clusters, merges, and the near-uniform start; public as
:func:`jaxdyn.pde.cluster_counts`, :func:`jaxdyn.pde.first_clusters`, … beside the density
solver whose output they read).
"""

from ._particles import (
    gram as gram,
    pair_fraction as pair_fraction,
    cluster_labels as cluster_labels,
    cluster_count as cluster_count,
    gram_rank as gram_rank,
    cluster_masses as cluster_masses,
    cluster_centres as cluster_centres,
    span_dimension as span_dimension,
    interaction_energy as interaction_energy,
    log_partition_energy as log_partition_energy,
    hitting_times as hitting_times,
    merge_events as merge_events,
    MergeEvents as MergeEvents,
    CLOSURE_MAX_PARTICLES as CLOSURE_MAX_PARTICLES,
)

__all__ = [
    "gram",
    "pair_fraction",
    "cluster_labels",
    "cluster_count",
    "gram_rank",
    "cluster_masses",
    "cluster_centres",
    "span_dimension",
    "interaction_energy",
    "log_partition_energy",
    "hitting_times",
    "merge_events",
    "MergeEvents",
    "CLOSURE_MAX_PARTICLES",
]
