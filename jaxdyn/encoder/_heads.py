"""A checkpoint's attention heads as particle weights (docs/math.md §H.2).

For layer l and head h (rows ``hs`` = h·d_h … (h+1)·d_h − 1 of the head axis; dense weights
stored (in, out), so q = x Wq + bq):

    Q_{l,h} = Wq[:, hs]ᵀ, K_{l,h} = Wk[:, hs]ᵀ            (d_h, d)
    V_{l,h} = (Wv[:, hs] Wo[hs, :])ᵀ                        (d, d), rank d_h
    u_{l,h} = K_{l,h}ᵀ bq[hs]                              (d,)   key-side logit bias
    c_l     = bv Wo + bo                                   (d,)   constant drift
    β       = 1/√d_h

Then the encoder's attention sublayer (:func:`jaxdyn.encoder.self_attention`, unmasked) on
hidden states x is exactly Σ_h V_{l,h} Σ_j softmax_j(β(⟨Q x_i, K x_j⟩ + ⟨u, x_j⟩)) x_j + c_l:
the other terms of ⟨q_i, k_j⟩ (⟨Q x_i, bk⟩, ⟨bq, bk⟩) do not depend on j and cancel in the
softmax, and Σ_j w_ij = 1 carries the value bias into c_l. What the particle dynamics leaves
out of a layer is its residual and LayerNorms and the feed-forward block.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ._bert import BertConfig, BertParams


def attention_heads(params: BertParams, cfg: BertConfig) -> dict:
    """Per-layer, per-head particle weights of a BERT-family checkpoint (module docstring).

    ``jaxdyn.models.DepthAttention.from_heads`` turns them into a particle field. Jittable.

    Args:
      params: the checkpoint's :class:`BertParams`.
      cfg: its :class:`BertConfig`.

    Returns:
      ``{"Q", "K": (L, H, d_h, d), "V": (L, H, d, d), "u": (L, H, d), "c": (L, d), "beta"}``.

    Raises:
      ValueError: if cfg is not a :class:`BertConfig`.
    """
    if not isinstance(cfg, BertConfig):
        raise ValueError(f"cfg must be a BertConfig, got {type(cfg).__name__}")
    lp = params.layers
    L, d = lp.wq.shape[0], lp.wq.shape[1]
    H, dh = cfg.num_attention_heads, cfg.head_size

    def split(w):  # (L, d, d) (in, out) -> (L, H, dh, d): head rows of the transposed map
        return jnp.transpose(w.reshape(L, d, H, dh), (0, 2, 3, 1))

    Q, K = split(lp.wq), split(lp.wk)
    wv = lp.wv.reshape(L, d, H, dh)                   # x Wv[:, hs]
    wo = lp.wo.reshape(L, H, dh, d)                   # Wo[hs, :]
    V = jnp.einsum("lahe,lheb->lhba", wv, wo, precision="highest")  # (Wv_h Wo_h)ᵀ
    u = jnp.einsum("lhed,lhe->lhd", K, lp.bq.reshape(L, H, dh), precision="highest")
    c = jnp.einsum("la,lab->lb", lp.bv, lp.wo, precision="highest") + lp.bo
    return {"Q": Q, "K": K, "V": V, "u": u, "c": c,
            "beta": jnp.asarray(1.0 / math.sqrt(dh), lp.wq.dtype)}
