"""Online log-sum-exp tiles shared by the Sinkhorn geometries (dense online and block-sparse).

``eps * lse_j((pot_j − |p_i − o_j|²)/eps)`` for every point ``p_i``, streamed over key blocks
with the running maximum of :mod:`._online` (:func:`~._online.running_update`): memory
O(q_block · k_block), never N × M. The bound shift of the attention kernels is not used here:
at the small ε of concentrated clouds (ε ~ 1e-6 against costs of order 1) no bound of a row's
terms stays within ``SAFE_SHIFT`` of its maximum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .._checks import any_nonfinite, nan_where, real_arrays, scalar_domain
from ._online import finite_or_zero, map_query_blocks, pad_rows, running_update

__all__ = ["LSE_K_BLOCK", "blocked_lse", "lse_key_block", "lse_tile"]


def _sq_dists(u, v):
    """|u_i - v_j|^2 by differences (no |u|^2 + |v|^2 - 2 u.v cancellation, no matmul)."""
    return jnp.sum((u[:, None, :] - v[None, :, :]) ** 2, axis=-1)


#: key-block size of the online log-sum-exp (points of the other cloud per block).
LSE_K_BLOCK = 512


def lse_key_block() -> int:
    """Key block of the online geometry: cache-sized on CPU, 8x larger on accelerators.

    Returns:
      The key block size for the default backend.
    """
    return LSE_K_BLOCK if jax.default_backend() == "cpu" else 8 * LSE_K_BLOCK


def lse_tile(q, keys, pot, inv, carry):
    """Fold one tile of the online log-sum-exp of ``(pot_k − |keys_k − q_i|²) · inv``.

    Updates the running (maximum, rescaled sum) ``carry`` of every row q_i with the tile's
    terms (:func:`~._online.running_update`): ``M' = max(M, max_k l_ik)``, ``s' = s e^{M − M'}
    + Σ_k e^{l_ik − M'}``, so that ``M + log s`` is the log-sum-exp of the terms seen. The cost
    by differences, ``Σ_c (k_c − q_c)²``; ``pot = −inf`` terms contribute nothing. The maximum
    carries no derivative (it cancels in ``M + log s``).

    Args:
      q: (rows, d) points.
      keys: (kb, d) points of the other cloud.
      pot: (kb,) potentials of the keys.
      inv: 1 / ε.
      carry: (maximum (rows,), rescaled sum (rows,)); start from (−inf, 0).

    Returns:
      The updated carry.
    """
    mx, s = carry
    d = q.shape[1]
    cost = (q[:, None, 0] - keys[None, :, 0]) ** 2
    for c in range(1, d):
        cost = cost + (q[:, None, c] - keys[None, :, c]) ** 2
    logits = _times_inv(pot[None, :] - cost, jnp.asarray(inv, cost.dtype))
    return running_update(mx, s, logits, lambda w: jnp.sum(w, axis=1))


@jax.custom_jvp
def _times_inv(x, inv):
    """``x · inv``, whose derivative in ``inv`` takes the −inf entries of x (weight 0) as 0."""
    return x * inv


def _times_inv_jvp(primals, tangents):
    """The derivative of :func:`_times_inv` (symbolic zeros: only the parts asked for)."""
    # (−inf − cost) · inv has the derivative −inf in inv, which times the term's zero weight
    # made the gradient in ε NaN. Rather than masking every term in the tile (a select a term
    # on the forward pass), the forward pass is the plain product and only the derivative in
    # inv reads the mask.
    x, inv = primals
    dx, dinv = tangents
    out = x * inv
    parts = []
    if not isinstance(dx, SymbolicZero):
        parts.append(dx * inv)
    if not isinstance(dinv, SymbolicZero):
        parts.append(jnp.where(x == -jnp.inf, jnp.zeros((), x.dtype), x) * dinv)
    return out, sum(parts[1:], parts[0]) if parts else jnp.zeros_like(out)


_times_inv.defjvp(_times_inv_jvp, symbolic_zeros=True)


def blocked_lse(pts, other, pot, eps, *, q_block: int = 1024, k_block: int = LSE_K_BLOCK):
    r"""``eps · log Σ_k exp((pot_k − |other_k − p|^2) / eps)`` for every row ``p`` of ``pts``.

    The Sinkhorn kernel of the squared-Euclidean cost, computed tile by tile: rows in
    blocks of ``q_block``, the other cloud in blocks of ``k_block`` with a running maximum
    and a rescaled running sum (the online log-sum-exp of the attention kernels). Nothing
    of size N x M is ever formed: memory O(q_block · k_block), and the program (hence the
    compile time) does not grow with N or M. The cost is formed by differences,
    ``Σ_c (o_c − p_c)^2``, never as ``|o|^2 + |p|^2 − 2 o·p``: at the small ε of
    concentrated clouds (ε ~ 1e-6 against |x|^2 = 1) the cancellation of the expanded form
    would move the exponents by O(1).

    ``pot = −inf`` entries (and the padding of the last block) contribute nothing; a row
    whose terms are all ``−inf`` gives ``−inf``.

    Args:
      pts: (n, d) points.
      other: (m, d) points of the other cloud.
      pot: (m,) potentials. ``−inf`` is a mask, not a fault: that point of ``other``
        contributes nothing and the rows stay finite (a Sinkhorn potential ``log 0`` of a
        point of zero weight); a NaN gives NaN rows and ``+inf`` gives ``+inf`` rows.
      eps: the entropic regularisation ε > 0, finite. A traced value outside the domain
        gives NaN.
      q_block: rows per block.
      k_block: points of the other cloud per block.

    Dtypes: float32 or float64; integers are converted to the float dtype of the other
    inputs (JAX's default float where none is a float); float16, bfloat16 and complex are
    refused (a TypeError naming the parameter).

    Returns:
      (n,) log-sum-exps times ε; NaN where ``pts`` or ``other`` holds a NaN or inf (``pot``
      may hold ``−inf``: those entries contribute nothing).

    Raises:
      ValueError: shapes that disagree (``pts`` (n, d) and ``other`` (m, d) with d >= 1,
        ``pot`` (m,)), or a concrete ``eps`` that is not finite and > 0.
    """
    pts, other, pot = real_arrays(pts=pts, other=other, pot=pot, fn="blocked_lse")
    ps, os_, qs = np.shape(pts), np.shape(other), np.shape(pot)
    if len(ps) != 2 or len(os_) != 2 or ps[1] != os_[1] or ps[1] < 1:
        raise ValueError(f"blocked_lse: pts (n, d) and other (m, d) must share d >= 1, got "
                         f"shapes {ps} and {os_}")
    if qs != os_[:1]:
        raise ValueError(f"blocked_lse: pot must have shape ({os_[0]},) (one potential a point "
                         f"of other), got {qs}")
    return nan_where(any_nonfinite(pts, other),
                     _blocked_lse(pts, other, pot, eps, q_block=q_block, k_block=k_block))


def _blocked_lse(pts, other, pot, eps, *, q_block: int = 1024, k_block: int = LSE_K_BLOCK):
    """:func:`blocked_lse` unchecked and unflagged (the Sinkhorn geometries' every iteration)."""
    err, bad = scalar_domain("eps", eps, low=0, low_open=True, what=" (entropic regularisation)")
    if err:
        raise ValueError(err)
    if bad is not None:  # a traced ε: its invalid lanes compute with ε = 1, NaN after
        return nan_where(jnp.any(bad), _lse(pts, other, pot, jnp.where(bad, 1, eps), q_block,
                                            k_block))
    return _lse(pts, other, pot, eps, q_block, k_block)


def _lse(pts, other, pot, eps, q_block, k_block):
    """:func:`blocked_lse` after its check of ε."""
    n, d = pts.shape
    m = other.shape[0]
    dtype = pts.dtype
    kb = max(1, min(int(k_block), m))
    other_p, nk = pad_rows(other, kb)
    pot_p, _ = pad_rows(pot.astype(dtype), kb, value=-jnp.inf)
    blocks = (other_p.reshape(nk, kb, d), pot_p.reshape(nk, kb))
    inv = 1.0 / eps

    def rows(q):
        def step(carry, block):
            return lse_tile(q, block[0], block[1], inv, carry), None

        rb = q.shape[0]
        init = (jnp.full((rb,), -jnp.inf, dtype), jnp.zeros((rb,), dtype))
        (mx, s), _ = jax.lax.scan(step, init, blocks)
        return eps * (finite_or_zero(mx) + jnp.log(s))

    return map_query_blocks(rows, q_block, pts)
