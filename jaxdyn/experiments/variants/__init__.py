"""Experiment kind ``variants``: Transformer variants of the sphere dynamics.

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

from ..kinds import kind_exports
from .schema import BATCH_AXES, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__)
