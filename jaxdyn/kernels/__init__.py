"""Attention kernels and the online log-sum-exp tiles of the Sinkhorn geometries.

The interaction ``Σ_j w_ij y_j`` with softmax / unnormalised / hardmax weights, dense (N × M
logits), blocked (online softmax over key blocks, memory O(q_block · k_block)) or local
(block-sparse: only the key blocks that can matter at a certified tolerance); the
variants (heads, causal masks, ALiBi / RoPE positions, L2 and Sinkhorn weights); and the
online log-sum-exp tiles that the Sinkhorn geometries share. Every blocked kernel runs on one
online-softmax / log-sum-exp core (``jaxdyn/kernels/_online.py``).
"""

from ._attention import (
    AUTO_LOCAL_MAX_VISITED as AUTO_LOCAL_MAX_VISITED,
    AUTO_LOCAL_MIN_KEYS as AUTO_LOCAL_MIN_KEYS,
    DEFAULT_BLOCKS as DEFAULT_BLOCKS,
    HIGHEST as HIGHEST,
    KERNELS as KERNELS,
    NORMALIZATIONS as NORMALIZATIONS,
    SAFE_SHIFT as SAFE_SHIFT,
    blocked as blocked,
    interaction as interaction,
    local_interaction as local_interaction,
    pad_rows as pad_rows,
    resolve_kernel as resolve_kernel,
)
from ._flash import attend as attend
from ._local import (
    DEFAULT_TOL as DEFAULT_TOL,
    LocalStats as LocalStats,
    Ordering as Ordering,
    spatial_order as spatial_order,
)
from ._lse import blocked_lse as blocked_lse, lse_tile as lse_tile
from ._observables import WeightStats as WeightStats, weight_statistics as weight_statistics
from ._variants import (
    CAUSAL_LARGE_N as CAUSAL_LARGE_N,
    CAUSAL_Q_BLOCK as CAUSAL_Q_BLOCK,
    MASKS as MASKS,
    attention_weights as attention_weights,
    default_rope_freqs as default_rope_freqs,
    heads_interaction as heads_interaction,
    rope as rope,
    sinkhorn_key_bias as sinkhorn_key_bias,
)

__all__ = [
    "AUTO_LOCAL_MAX_VISITED",
    "AUTO_LOCAL_MIN_KEYS",
    "CAUSAL_LARGE_N",
    "CAUSAL_Q_BLOCK",
    "DEFAULT_BLOCKS",
    "DEFAULT_TOL",
    "HIGHEST",
    "KERNELS",
    "LocalStats",
    "MASKS",
    "NORMALIZATIONS",
    "Ordering",
    "SAFE_SHIFT",
    "WeightStats",
    "attend",
    "attention_weights",
    "blocked",
    "blocked_lse",
    "default_rope_freqs",
    "heads_interaction",
    "interaction",
    "local_interaction",
    "lse_tile",
    "pad_rows",
    "resolve_kernel",
    "rope",
    "sinkhorn_key_bias",
    "spatial_order",
    "weight_statistics",
]
