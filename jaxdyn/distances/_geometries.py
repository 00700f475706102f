"""Point-cloud geometries of ott-jax whose log-sum-exp kernels are computed here.

The dense online tiles (:func:`~jaxdyn.kernels.blocked_lse`) and the block-sparse tiles of the
multiscale solver (:func:`jaxdyn.kernels._sparse.listed_lse`, the block-sparse core's
log-sum-exp over the key blocks that a certified bound keeps). Both are subclasses of ott's ``PointCloud`` that override its public ``apply_lse_kernel`` (the
one kernel that Sinkhorn's updates, its marginal error and its dual cost go through) and, for
the block-sparse one, the pytree methods that carry its neighbour lists. The classes are built
on first use, so that importing :mod:`jaxdyn.distances` does not import ott.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ..kernels._lse import _blocked_lse as blocked_lse  # (clouds checked by the solver)
from ..kernels._sparse import listed_lse

#: points per leaf block (tiles of a block's rows x 8 blocks of keys): smaller blocks prune
#: more, larger tiles run faster.
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
    and a dense ``PointCloud`` forms the N x M cost. This subclass keeps ott's
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


@functools.cache
def _sparse_point_cloud_class():
    """The class of an ott ``PointCloud`` whose log-sum-exp kernel visits only the selected blocks.

    ott has no block-sparse geometry: this subclass carries the neighbour lists of the
    multiscale solver as pytree leaves (its ``tree_flatten``/``tree_unflatten`` extend ott's
    own, whatever their layout) and overrides the public ``apply_lse_kernel`` with the core's
    :func:`jaxdyn.kernels._sparse.listed_lse`.

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
                res = listed_lse(self.y, self.x, f, eps, self.nbr_y, block=self.block)
            else:  # for each x_i: eps * lse_j((g_j - C_ij) / eps)
                res = listed_lse(self.x, self.y, g, eps, self.nbr_x, block=self.block)
            return res, jnp.ones_like(res)

    return SparsePointCloud


def sparse_geometry(x, y, epsilon, nbr_x, nbr_y, block=BLOCK):
    """An ott point cloud of x, y whose kernel visits only the listed blocks (:func:`jaxdyn.kernels._sparse.listed_lse`)."""
    return _sparse_point_cloud_class()(x, y, epsilon=epsilon, nbr_x=nbr_x, nbr_y=nbr_y,
                                       block=block)
