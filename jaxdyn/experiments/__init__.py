"""Experiment kinds and the engine that runs them.

A kind is a package ``experiments/<kind>/`` that satisfies :class:`ExperimentKind` (the contract,
in :mod:`.kinds`): ``SCHEMA``, ``BATCH_AXES``, ``check``, ``estimate_bytes``, ``output_bytes``
(its ``schema`` module, loaded without JAX), ``run_points`` and ``step_functions`` (``run``),
``summarize`` (``summary``) and ``plot`` (``figures``).

The engine (:mod:`.engine`) is a pipeline of parts by role: :mod:`.planning` (grid, chunks,
memory), :mod:`.folder` (lock, resume, merge), :mod:`.runner` and :mod:`.processes` (the chunks
on this machine and across processes), :mod:`.reporting` (summary, figures). Shared by the
kinds: :mod:`.segments` (the particle kinds' chunk integrator, calls of ``simulate`` in
segments), :mod:`.sphere_fields` (the sphere kinds' config, no JAX) and :mod:`.sphere_common`
(their models and initial clouds).
"""

from __future__ import annotations

from .kinds import KINDS, ExperimentKind, StepFunction, get_kind, kind_exports, lazy_names
from .engine import RunResult, report, resolve_config, run_experiment

__all__ = ["KINDS", "ExperimentKind", "StepFunction", "get_kind", "kind_exports", "lazy_names",
           "run_experiment", "report", "resolve_config", "RunResult"]
