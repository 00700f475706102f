"""Experiment kinds and the engine that runs them.

A kind is a package ``experiments/<kind>/`` split by role — ``schema`` (config fields, checks,
memory estimates), ``run`` (``run_points``), ``summary`` (``summarize``) and ``figures``
(``plot``) — whose ``__init__`` exposes:

* ``SCHEMA``: ``{field: config.Field}`` of its top-level fields (sweepable ones marked);
* ``BATCH_AXES``: sweep axes that may vary inside one vmapped chunk (others split chunks);
* ``check(cfg) -> list[str]``: cross-field validation (raise ``ConfigError``) and warnings;
* ``estimate_bytes(point_cfg) -> int``: memory of one grid point (and optionally
  ``output_bytes(point_cfg)``: what it adds to the merged Dataset);
* ``run_points(point_cfgs) -> (vars, coords)``: compute a chunk of points sharing every
  non-batch field; ``vars`` maps a name to ``(dims, array)`` with a leading point axis,
  ``coords`` maps a dim to its values; a boolean var ``finite`` is the per-point status;
* ``summarize(cfg, ds) -> dict`` and ``plot(cfg, ds, out_dir) -> list[Path]``.

Shared by the kinds: ``engine`` (the sweep: grid, chunks, resume, the merged Dataset),
``segments`` (the one chunk integrator of the particle runs) and ``sphere_common`` (the config
fields, models and initial clouds of the sphere kinds).
"""

from __future__ import annotations

import importlib
import sys

from ..config import ConfigError

KINDS = {
    "sphere": "jaxdyn.experiments.sphere",
    "concentration": "jaxdyn.experiments.concentration",
    "gaussian": "jaxdyn.experiments.gaussian",
    "reachability": "jaxdyn.experiments.reachability",
    "gaussianity": "jaxdyn.experiments.gaussianity",
    "pde": "jaxdyn.experiments.pde",
    "variants": "jaxdyn.experiments.variants",
}


def lazy_names(package: str, names: dict):
    """A module ``__getattr__`` for a kind's package: ``names`` maps a name to the submodule
    (``run``, ``summary``, ``figures``) that defines it, imported on first use (PEP 562)."""
    def __getattr__(name):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def get_kind(name: str):
    if name not in KINDS:
        raise ConfigError(f"config field 'kind': unknown experiment kind {name!r}; known kinds: "
                          f"{', '.join(sorted(KINDS))}")
    try:
        return importlib.import_module(KINDS[name])
    except ModuleNotFoundError as e:
        if e.name == KINDS[name]:
            raise ConfigError(f"experiment kind {name!r} is not available in this version") from None
        raise


from .engine import RunResult, report, resolve_config, run_experiment  # noqa: E402

__all__ = ["KINDS", "get_kind", "lazy_names", "run_experiment", "report", "resolve_config", "RunResult"]
