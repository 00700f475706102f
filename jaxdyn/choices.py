"""The named choices of the library's models, kernels and schemes, importing no JAX.

One source for each: the JAX modules (:mod:`jaxdyn.kernels`, :mod:`jaxdyn.models`,
:mod:`jaxdyn.simulation`) import them from here, and so do the config schemas of the experiments,
which ``jaxdyn config`` loads without JAX.
"""

__all__ = ["ATTENTIONS", "KERNELS", "MASKS", "NORMALIZATIONS", "PLACEMENTS", "SDE_METHODS"]

#: attention kernels: dense (N × N logits), blocked (online softmax over key blocks), local
#: (block-sparse: the key blocks that can matter at a tolerance), auto
KERNELS = ("dense", "blocked", "local", "auto")
#: attention weights of SphereAttention: softmax, unnormalised (USA), hardmax (β = ∞)
NORMALIZATIONS = ("softmax", "unnormalized", "hardmax")
#: attention masks of the multi-head models (the particle index is the position)
MASKS = ("none", "causal")
#: attention logits/weights of MultiHeadAttention: softmax, L2 distance, Sinkhorn (doubly stochastic)
ATTENTIONS = ("softmax", "l2", "sinkhorn")
#: LayerNorm placements around an attention field (jaxdyn.models.layer_norm)
PLACEMENTS = ("postln", "preln", "periln", "ngpt")
#: schemes of jaxdyn.simulate_sde
SDE_METHODS = ("geodesic_em", "heun", "midpoint")
