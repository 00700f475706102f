r"""Softmax attention with a per-key bias, blocked forward and reverse (the measure control's kernel).

For queries ``q`` (n, p), keys ``k`` (m, p), values ``v`` (m, e) and a per-key bias ``c`` (m,),

    out_i = Σ_j w_ij v_j,   w_ij = exp(l_ij) / Σ_k exp(l_ik),   l_ij = q_i · k_j + c_j,

computed by the online-softmax core of :mod:`._online` (:func:`~._online.sums`), the core of
:func:`jaxdyn.kernels.interaction` and of the variants' kernel too: one (query block × key
block) tile at a time, memory O(q_block · k_block), never O(n · m). On CPU the weights are
shifted by the Cauchy–Schwarz bound ``|q_i| max_j |k_j| + max_j c_j`` of the row's logits
where that is safe (checked per query block against the maximum of the row's first key block,
``SAFE_SHIFT``), else by the running maximum; on accelerators always the running maximum. The
derivative is the core's: a second blocked pass that recomputes each tile's exponentials
(the flash-attention backward pass; with ``s_ij = w_ij (g_i · v_j − g_i · out_i)``,
``∂q_i = Σ_j s_ij k_j``, ``∂k_j = Σ_i s_ij q_i``, ``∂v_j = Σ_i w_ij g_i``,
``∂c_j = Σ_i s_ij``), whose residuals are the inputs and the rows' references,
O((n + m)(p + e)).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ._attention import _guard, default_cpu_logits
from ._online import FUSED_MAX_D, bound, ratio, sums

#: default tiles on CPU (query rows, keys): 1024 x 512 float64 tiles (4 MiB) stream through the
#: cache; the reverse pass holds a few such tiles at a time.
Q_BLOCK = 1024
K_BLOCK = 512


def attend(q, k, v, c, q_block: int = Q_BLOCK, k_block: int = K_BLOCK):
    """Softmax attention ``Σ_j softmax_j(q_i · k_j + c_j) v_j`` in tiles, forward and reverse.

    Args:
        q: (n, p) queries (pre-scaled).
        k: (m, p) keys.
        v: (m, e) values.
        c: (m,) per-key bias of the logits.
        q_block: query rows per tile.
        k_block: keys per tile.

    Returns:
        (n, e) the averages, in the inputs' promoted dtype.
    """
    dtype = jnp.result_type(q, k, v, c)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(float)
    q, k, v, c = (jnp.asarray(a, dtype) for a in (q, k, v, c))
    return _attend(q, k, v, c, q_block=max(1, int(q_block)), k_block=max(1, int(k_block)),
                   safe=_guard(dtype))


@functools.partial(jax.jit, static_argnames=("q_block", "k_block", "safe"))
def _attend(q, k, v, c, *, q_block, k_block, safe):
    """:func:`attend` on inputs of one dtype: the core's step picked per platform."""
    accel = "fused" if max(q.shape[1], v.shape[1]) <= FUSED_MAX_D else "dot"
    opts = dict(q_block=q_block, k_block=k_block, safe=safe)
    return jax.lax.platform_dependent(
        q, k, v, c,
        cpu=functools.partial(_attend_one, mode="bound", step="dot",
                              logits=default_cpu_logits(q.shape[1]), **opts),
        default=functools.partial(_attend_one, mode="running", step=accel, logits="matmul",
                                  **opts))


def _attend_one(q, k, v, c, *, mode, step, logits, q_block, k_block, safe):
    """The core's sums with the key bias ``c``, then the quotient."""
    e = v.shape[1]
    r = bound(q, k, c) if mode == "bound" else None
    _, acc = sums(q, k, v, mode=mode, q_block=q_block, k_block=k_block, step=step,
                  logits=logits, bias=c, r=r, safe=safe)
    return ratio(acc[:, :e], acc[:, e:])
