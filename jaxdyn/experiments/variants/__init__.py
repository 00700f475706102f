"""Experiment kind ``variants``: Transformer variants of the sphere dynamics (issue 15).

Per grid point: a LayerNorm placement (``norm``: post-LN, pre-LN, peri-LN, nGPT), weights that
are constant, redrawn from an ensemble every ``depth.period`` (rotf's ``--regen_period``), or
the trained heads of MiniLM layer by layer (``depth.source: minilm``, one head with ``head``),
and noise ``sigma`` (the Stratonovich SDE on the sphere, plain noise in R^d for pre-/peri-LN).
Records the mean pairwise inner product of the directions x_i = z_i/|z_i| and the mean radius
|z_i| against t; the summary gives the time to a single cluster (mean inner product above
``single_cluster_ip``). A new kind rather than fields of ``sphere``: the sphere kind's chunk
integrator assumes autonomous, noiseless systems on the sphere (every segment restarts at
t = 0), and these points are time-dependent, noisy, or live in R^d.
"""

from .. import lazy_names
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, output_bytes

# run, summary and figures load JAX (and matplotlib): loaded on first use, so that the
# config check (schema) of `jaxdyn config` loads neither.
__getattr__ = lazy_names(__name__, {
    "plot": "figures",
    "run_points": "run",
    "summarize": "summary",
})

__all__ = ["SCHEMA", "BATCH_AXES", "check", "estimate_bytes", "output_bytes", "run_points",
           "summarize", "plot"]
