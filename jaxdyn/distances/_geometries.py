"""Point-cloud geometries of ott-jax whose log-sum-exp kernels are computed here.

The dense online tiles (:func:`~jaxdyn.kernels.blocked_lse`) and the block-sparse tiles of the
multiscale solver (:func:`sparse_lse`, only the key blocks that a certified bound keeps). Both are subclasses of ott's ``PointCloud`` that override its public ``apply_lse_kernel`` (the
one kernel that Sinkhorn's updates, its marginal error and its dual cost go through) and, for
the block-sparse one, the pytree methods that carry its neighbour lists. The classes are built
on first use, so that importing :mod:`jaxdyn.distances` does not import ott.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ..kernels import blocked_lse, lse_tile, pad_rows
from ..kernels._blocks import by_length, unsort

#: points per leaf block: tiles of 256 rows x 8 blocks of 256 keys ran at 4.0 G terms/s on
#: the 2-core CPU (N = 16384, every block visited; 128-point blocks 3.2, the dense online
#: kernel's 1024 x 512 tiles 2.0); smaller blocks prune more, larger tiles run faster.
BLOCK = 256

#: key block of the online geometry by platform: cache-sized on CPU, 8x larger on
#: accelerators, where every block step is a kernel launch.
ONLINE_KEY_BLOCK = {"cpu": 512, "gpu": 4096}


def online_key_block() -> int:
    """Key block of the online geometry on the default backend."""
    return ONLINE_KEY_BLOCK["cpu" if jax.default_backend() == "cpu" else "gpu"]


@functools.cache
def _online_point_cloud_class():
    """The class of an ott ``PointCloud`` whose online log-sum-exp is computed here, tile by tile.

    Why a subclass: ott-jax 0.6 (the newest release) cannot run its own online path under
    jax 0.10: ``PointCloud(x, y, batch_size=32)`` in a Sinkhorn solve raises
    ``AttributeError: module 'jax.interpreters.batching' has no attribute 'is_vmappable'``
    (measured), and a dense ``PointCloud`` forms the N x M cost. This subclass keeps ott's
    solver and overrides only the public ``apply_lse_kernel`` with :func:`blocked_lse`:
    ``batch_size`` rows at a time against blocks of :func:`online_key_block` points of the
    other cloud, memory O(batch_size · block). The signed, weighted form (``vec``, used by
    ott only to apply a transport plan, never by Sinkhorn) is computed a row block at a time.

    Returns:
        The subclass (built once, on first use).
    """
    from ott.geometry import pointcloud

    @jtu.register_pytree_node_class
    class OnlinePointCloud(pointcloud.PointCloud):
        def apply_lse_kernel(self, f, g, eps, vec=None, axis=0):
            if axis == 0:  # for each y_j: eps * lse_i((f_i - C_ij) / eps)
                pts, other, pot = self.y, self.x, f
            else:  # for each x_i: eps * lse_j((g_j - C_ij) / eps)
                pts, other, pot = self.x, self.y, g
            if vec is None:
                res = blocked_lse(pts, other, pot, eps, q_block=self.batch_size,
                                  k_block=online_key_block())
                return res, jnp.ones_like(res)

            def one(p):
                c = jnp.sum((other - p[None, :]) ** 2, axis=-1)
                return jax.nn.logsumexp((pot - c) / eps, b=vec, return_sign=True)

            res, sgn = jax.lax.map(one, pts, batch_size=self.batch_size)
            return eps * res, sgn

    return OnlinePointCloud


def online_geometry(x, y, epsilon, batch_size):
    """An ott point cloud of x, y whose kernel is :func:`blocked_lse` (``batch_size`` rows)."""
    return _online_point_cloud_class()(x, y, epsilon=epsilon, batch_size=batch_size)


def _blocks(a, block, value=0.0):
    """(n, ...) -> (nb, block, ...), padding the last block with ``value``."""
    p, nb = pad_rows(a, block, value=value)
    return p.reshape((nb, block) + a.shape[1:])


def _chunk(k: int) -> int:
    """Key blocks gathered per step of :func:`sparse_lse` (K is a multiple of 4)."""
    return 8 if k % 8 == 0 else 4 if k % 4 == 0 else 1


def sparse_lse(pts, other, pot, eps, nbr, *, block: int = BLOCK):
    r"""``eps · log Σ_{k in kept blocks} exp((pot_k − |other_k − p|^2) / eps)`` for every row.

    ``pts`` (n, d) and ``other`` (m, d) are padded leaves (:func:`make_blocks`); ``nbr`` (nq, K)
    lists, for each row block, the key blocks to visit first (indices in ``[0, nk]``, ``nk``
    being an empty block that contributes nothing: the padding of the list, after the kept
    blocks). Online log-sum-exp over a row block's own kept blocks only (a loop with a
    per-row-block trip count), 8 (or 4) blocks gathered per step: tiles of ``block`` x 8 ``block``
    (measured on CPU, N = 16384, all blocks visited: one block per step 0.73 G terms/s, 4
    per step 3.7, 8 per step 4.1; ``blocked_lse``'s 1024 x 512 tiles 2.0). The cost is formed
    by differences, as in ``blocked_lse``.

    Returns:
        The row log-sum-exps (n,) (``-inf`` for a row whose listed terms are all ``-inf``).
    """
    n, d = pts.shape
    dtype = pts.dtype
    q = _blocks(pts, block)
    o = _blocks(other, block)
    pb = _blocks(pot.astype(dtype), block, value=-jnp.inf)
    o = jnp.concatenate([o, jnp.zeros((1, block, d), dtype)], axis=0)
    pb = jnp.concatenate([pb, jnp.full((1, block), -jnp.inf, dtype)], axis=0)
    inv = 1.0 / eps
    k = nbr.shape[1]
    kc = _chunk(k)

    nk = o.shape[0] - 1

    def rows(args):
        qr, idx = args

        def step(t, carry):
            js = jax.lax.dynamic_slice(idx, (t * kc,), (kc,))
            return lse_tile(qr, o[js].reshape(kc * block, d), pb[js].reshape(kc * block), inv,
                            carry)

        init = (jnp.full((block,), -jnp.inf, dtype), jnp.zeros((block,), dtype))
        # only the chunks holding kept blocks (they come first): a row block pays for its
        # own list, not for the longest one
        steps = (jnp.sum(idx < nk) + kc - 1) // kc
        mx, s = jax.lax.fori_loop(0, steps, step, init)
        return eps * (mx + jnp.log(s))

    # several row blocks per step (vmapped: each runs to the longest list of its batch),
    # taken in the order of their list lengths, so that a batch holds lists of one length.
    # Measured inside jit, N = 10^5, leaves of 64 with 20-40 kept blocks: one row block per
    # step 0.59 G terms per CPU-s, 4 per step 0.72, 8 per step 0.76. Batches in leaf order
    # would run a fifth to a quarter more steps than their lists hold; sorted, a few percent.
    order = by_length(jnp.sum(nbr < nk, axis=1), kc)
    out = jax.lax.map(rows, (q[order], nbr[order]), batch_size=max(1, 512 // block))
    return unsort(out, order).reshape(-1)[:n]


@functools.cache
def _sparse_point_cloud_class():
    """The class of an ott ``PointCloud`` whose log-sum-exp kernel visits only the selected blocks.

    ott has no block-sparse geometry: this subclass carries the neighbour lists of the
    multiscale solver as pytree leaves (its ``tree_flatten``/``tree_unflatten`` extend ott's
    own, whatever their layout) and overrides the public ``apply_lse_kernel`` with
    :func:`sparse_lse`.

    Returns:
        The subclass (built once, on first use).
    """
    from ott.geometry import pointcloud

    @jtu.register_pytree_node_class
    class SparsePointCloud(pointcloud.PointCloud):
        def __init__(self, x, y=None, *, nbr_x=None, nbr_y=None, block=BLOCK, **kwargs):
            super().__init__(x, y, **kwargs)
            self.nbr_x = nbr_x  # row blocks of x -> blocks of y (the f update)
            self.nbr_y = nbr_y  # row blocks of y -> blocks of x (the g update)
            self.block = block

        def tree_flatten(self):
            children, aux = super().tree_flatten()
            return (tuple(children), self.nbr_x, self.nbr_y), (aux, self.block)

        @classmethod
        def tree_unflatten(cls, aux_data, children):
            base, nbr_x, nbr_y = children
            aux, block = aux_data
            geom = super().tree_unflatten(aux, list(base))
            geom.nbr_x, geom.nbr_y, geom.block = nbr_x, nbr_y, block
            return geom

        def apply_lse_kernel(self, f, g, eps, vec=None, axis=0):
            if vec is not None:
                raise NotImplementedError(
                    "the block-sparse geometry only serves Sinkhorn's log-sum-exp updates")
            if axis == 0:  # for each y_j: eps * lse_i((f_i - C_ij) / eps)
                res = sparse_lse(self.y, self.x, f, eps, self.nbr_y, block=self.block)
            else:  # for each x_i: eps * lse_j((g_j - C_ij) / eps)
                res = sparse_lse(self.x, self.y, g, eps, self.nbr_x, block=self.block)
            return res, jnp.ones_like(res)

    return SparsePointCloud


def sparse_geometry(x, y, epsilon, nbr_x, nbr_y, block=BLOCK):
    """An ott point cloud of x, y whose kernel visits only the listed blocks (:func:`sparse_lse`)."""
    return _sparse_point_cloud_class()(x, y, epsilon=epsilon, nbr_x=nbr_x, nbr_y=nbr_y,
                                       block=block)
