"""jaxdyn: mean-field dynamics of Transformers in JAX.

Particles on the sphere under softmax self-attention (Paper A), Gaussian transformer
dynamics in R^d (Paper B), Wasserstein measurement and optax-driven control.

The top level holds the names the README uses; everything else lives in a subpackage with
one role each: ``jaxdyn.sphere``, ``kernels``, ``models``, ``integrators``, ``simulation``,
``spectral``, ``clusters``, ``gaussian``, ``distances``, ``control``, ``pde``, ``encoder``,
``weights``, ``choices`` (and the shell: ``config``, ``io``, ``plots``, ``experiments``, ``cli``).

Every driver returns a :class:`Solution` pytree whose ``result`` is a :class:`RESULTS` code
per member (diffrax's codes included): read it with ``.ok``, ``.status``, ``.messages``.
"""

__version__ = "0.1.0"

# Lazy: ``import jaxdyn`` (and the CLI's ``jaxdyn --help``) loads no JAX; each name below is
# imported on first use (PEP 562). The imports are spelled out for readers and type checkers.
import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ._results import (
        RESULTS as RESULTS,
        STATUS_NAMES as STATUS_NAMES,
        Solution as Solution,
        is_successful as is_successful,
        status_code as status_code,
        status_codes as status_codes,
        status_messages as status_messages,
        status_names as status_names,
    )
    from . import (  # noqa: F401  (the subpackages, for jaxdyn.<role>.<name>)
        choices, clusters, control, distances, encoder, gaussian, integrators, kernels, models, pde,
        simulation, spectral, sphere, weights,
    )
    from .models import (
        EuclideanAttention as EuclideanAttention,
        SphereAttention as SphereAttention,
        ZeroTemperature as ZeroTemperature,
        stack_models as stack_models,
    )
    from .sphere import (
        normalize as normalize,
        sample_mixture as sample_mixture,
        sample_sphere as sample_sphere,
        sample_vmf as sample_vmf,
    )
    from .simulation import (
        Trajectory as Trajectory,
        sharded_vmap as sharded_vmap,
        simulate as simulate,
        simulate_ensemble as simulate_ensemble,
    )
    from .spectral import (
        check_assumptions as check_assumptions,
        lyapunov as lyapunov,
        mass_near as mass_near,
        projection as projection,
        spectral_weights as spectral_weights,
    )
    from .distances import (
        bures_w2 as bures_w2,
        w2 as w2,
        w2_exact as w2_exact,
        w2_sinkhorn as w2_sinkhorn,
    )
    from .gaussian import solve_moments as solve_moments, solve_moments_batch as solve_moments_batch
    from .control import certificate as certificate, reach as reach
    from .clusters import (
        cluster_count as cluster_count,
        interaction_energy as interaction_energy,
        merge_events as merge_events,
        pair_fraction as pair_fraction,
    )
    from .io import open_results as open_results
    from .models import DepthAttention as DepthAttention, layer_norm as layer_norm
    from .models import MultiHeadAttention as MultiHeadAttention
    from .simulation import simulate_sde as simulate_sde
    from ._compile import (
        compile_stats as compile_stats,
        enable_compilation_cache as enable_compilation_cache,
    )
    from .kernels import interaction as interaction, local_interaction as local_interaction

_SUBPACKAGES = ("choices", "clusters", "control", "distances", "encoder", "gaussian", "integrators",
                "kernels", "models", "pde", "simulation", "spectral", "sphere", "weights")
_NAMES = {
    "._results": ("RESULTS", "STATUS_NAMES", "Solution", "is_successful", "status_code",
                  "status_codes", "status_messages", "status_names"),
    ".models": ("EuclideanAttention", "SphereAttention", "ZeroTemperature", "stack_models",
                "DepthAttention", "layer_norm", "MultiHeadAttention"),
    ".sphere": ("normalize", "sample_mixture", "sample_sphere", "sample_vmf"),
    ".simulation": ("Trajectory", "sharded_vmap", "simulate", "simulate_ensemble", "simulate_sde"),
    ".spectral": ("check_assumptions", "lyapunov", "mass_near", "projection", "spectral_weights"),
    ".distances": ("bures_w2", "w2", "w2_exact", "w2_sinkhorn"),
    ".gaussian": ("solve_moments", "solve_moments_batch"),
    ".control": ("certificate", "reach"),
    ".clusters": ("cluster_count", "interaction_energy", "merge_events", "pair_fraction"),
    ".io": ("open_results",),
    "._compile": ("compile_stats", "enable_compilation_cache"),
    ".kernels": ("interaction", "local_interaction"),
}
_WHERE = {name: mod for mod, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE) + ["__version__", "io", *_SUBPACKAGES]


def __getattr__(name):
    if name in _SUBPACKAGES or name == "io":  # (io: open_results's module, as before)
        return _importlib.import_module(f".{name}", __name__)
    if name in _WHERE:
        value = getattr(_importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxdyn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBPACKAGES) | set(_WHERE))
