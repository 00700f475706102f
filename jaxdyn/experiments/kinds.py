"""The contract between the engine and an experiment kind, and the registry of kinds.

A kind is a package ``experiments/<kind>/`` split by role — ``schema`` (config fields, checks,
memory estimates), ``run`` (``run_points``, ``step_functions``), ``summary`` (``summarize``) and
``figures`` (``plot``) — whose ``__init__`` exposes the members of :class:`ExperimentKind`.
Importing a kind loads no JAX: ``run``, ``summary`` and ``figures`` load on first use
(:func:`kind_exports`), so that ``jaxdyn config`` checks a config without them.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from ..config import ConfigError, Field

KINDS = {
    "sphere": "jaxdyn.experiments.sphere",
    "concentration": "jaxdyn.experiments.concentration",
    "gaussian": "jaxdyn.experiments.gaussian",
    "reachability": "jaxdyn.experiments.reachability",
    "gaussianity": "jaxdyn.experiments.gaussianity",
    "pde": "jaxdyn.experiments.pde",
    "variants": "jaxdyn.experiments.variants",
    "control": "jaxdyn.experiments.control",
    "long_context": "jaxdyn.experiments.long_context",
}

#: Members every kind defines in its ``schema`` module (loaded with the kind: no JAX).
SCHEMA_MEMBERS = ("SCHEMA", "BATCH_AXES", "check", "estimate_bytes", "output_bytes",
                  "process_split")
#: Members every kind defines in its other modules, loaded on first use: name → module.
LAZY_MEMBERS = {"run_points": "run", "step_functions": "run", "summarize": "summary",
                "plot": "figures"}


@dataclasses.dataclass(frozen=True)
class StepFunction:
    """A computation a kind runs on the device for one grid point, with example inputs.

    ``fn(*args)`` is what ``run_points`` runs (jitted by the driver it calls, or by the kind) for
    the point the function was built for; it is a pure JAX function of its array arguments, so
    ``jax.jit(fn)`` lowers it for any platform (tests/export/test_export_experiments.py exports
    it for cuda and tpu).

    Attributes:
      fn: the function; its result is a pytree of arrays.
      args: example arguments of ``fn`` for the point (concrete arrays or models).
      x64: whether the kind runs it with JAX's x64 mode on (``args`` were built so).
    """

    fn: Callable
    args: tuple
    x64: bool = False


@runtime_checkable
class ExperimentKind(Protocol):
    """What the engine asks of an experiment kind (a module satisfies it by its names).

    Attributes:
      SCHEMA: ``{field: config.Field}`` of the kind's top-level fields (sweepable ones marked).
      BATCH_AXES: sweep axes that may vary inside one chunk (the others split chunks: the
        points of a chunk share every other field).
    """

    SCHEMA: Mapping[str, Field]
    BATCH_AXES: tuple

    def check(self, cfg: dict) -> list:
        """Cross-field validation of a resolved config.

        Args:
          cfg: the resolved config.

        Returns:
          Warnings (strings) to print before the run; a bad config raises ``ConfigError``.
        """

    def estimate_bytes(self, point_cfg: dict) -> int:
        """Memory one grid point needs while its chunk computes.

        Args:
          point_cfg: the config of one grid point (the sweep's values filled in).

        Returns:
          Bytes.
        """

    def output_bytes(self, point_cfg: dict) -> int:
        """Bytes one grid point adds to the merged Dataset.

        Args:
          point_cfg: the config of one grid point.

        Returns:
          Bytes.
        """

    def process_split(self, cfg: dict) -> str:
        """How the processes of a ``jax.distributed`` run share the work (:mod:`.runner`).

        Args:
          cfg: the resolved config.

        Returns:
          ``"devices"``: every process runs every chunk and ``run_points`` shards its points over
          the devices of all processes; ``"points"``: ``run_points`` uses this process's devices
          only, and the engine deals the chunks (or parts of their points) out to the processes
          and gathers the outputs to process 0.
        """

    def run_points(self, point_cfgs: list) -> tuple:
        """Compute a chunk of grid points that share every non-batch field.

        Args:
          point_cfgs: the configs of the chunk's points.

        Returns:
          ``(vars, coords)``: ``vars`` maps a name to ``(dims, array)`` with a leading point axis
          (a boolean var ``finite`` is the per-point status); ``coords`` maps a dim to its values.
        """

    def step_functions(self, point_cfg: dict) -> dict:
        """The device computations ``run_points`` runs for one point.

        Args:
          point_cfg: the config of one grid point.

        Returns:
          ``{name: StepFunction}``.
        """

    def summarize(self, cfg: dict, ds: Any) -> dict:
        """The kind's results for ``summary.json``.

        Args:
          cfg: the resolved config.
          ds: the merged xarray Dataset.

        Returns:
          A JSON-serialisable mapping.
        """

    def plot(self, cfg: dict, ds: Any, out_dir: Path) -> list:
        """Draw the kind's figures.

        Args:
          cfg: the resolved config.
          ds: the merged xarray Dataset.
          out_dir: the run folder.

        Returns:
          The paths of the figures written.
        """


def get_kind(name: str) -> ExperimentKind:
    """The kind package named ``name`` (imported without JAX).

    Args:
      name: a key of :data:`KINDS`.

    Returns:
      The kind's module.

    Raises:
      ConfigError: an unknown kind, or one this installation lacks.
      ModuleNotFoundError: a module the kind imports is missing.
    """
    if name not in KINDS:
        raise ConfigError(f"config field 'kind': unknown experiment kind {name!r}; known kinds: "
                          f"{', '.join(sorted(KINDS))}")
    try:
        return importlib.import_module(KINDS[name])
    except ModuleNotFoundError as e:
        if e.name == KINDS[name]:
            raise ConfigError(f"experiment kind {name!r} is not available in this version") from None
        raise


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports a name from a submodule on first use.

    Args:
      package: the package's ``__name__``.
      names: a name → the submodule (``run``, ``summary``, ``figures``) that defines it.

    Returns:
      The ``__getattr__`` function.
    """
    def __getattr__(name):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def kind_exports(package: str, schema_extra: tuple = (), lazy_extra: Mapping[str, str] | None = None):
    """A kind package's ``__getattr__`` and ``__all__``.

    The package imports :data:`SCHEMA_MEMBERS` (and ``schema_extra``) from its ``schema``
    module itself; the members of :data:`LAZY_MEMBERS` (and ``lazy_extra``) load on first use.

    Args:
      package: the kind package's ``__name__``.
      schema_extra: further names the package imports from its schema.
      lazy_extra: further lazily loaded names → their submodule.

    Returns:
      ``(__getattr__, __all__)``.
    """
    lazy = {**LAZY_MEMBERS, **(lazy_extra or {})}
    return lazy_names(package, lazy), [*SCHEMA_MEMBERS, *schema_extra, *lazy]


__all__ = ["KINDS", "ExperimentKind", "StepFunction", "get_kind", "kind_exports", "lazy_names"]
