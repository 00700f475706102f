"""Particle vector fields as equinox Modules.

Each model is a vector field ``field(t, x, args) -> dx/dt`` on a cloud ``x`` of shape
(N, d), usable as a ``diffrax.ODETerm`` and by :func:`jaxdyn.simulate`. Parameters are
array leaves, so ``jax.vmap`` over a stack of models is a parameter sweep and ``jax.grad``
with respect to a model is control. ``manifold`` ("sphere" or "euclidean") tells the
integrators whether to retract onto S^{d-1}.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._attention import KERNELS, NORMALIZATIONS, HIGHEST, interaction
from ..sphere import tangent_project
from ._control import Control, at


def _is_concrete(a) -> bool:
    return not isinstance(a, jax.core.Tracer)


def _check_square(name, a, d=None):
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1] or (d is not None and shape[0] != d):
        want = f"({d}, {d})" if d is not None else "(d, d)"
        raise ValueError(f"{name} must be a square matrix of shape {want}, got shape {shape}")


def _as_array(a, dtype=None):
    if isinstance(a, (jax.Array, np.ndarray)) and dtype is None:
        return jnp.asarray(a)
    return jnp.asarray(a, dtype=dtype)


def _dtype_of(*arrays):
    dts = [a.dtype for a in arrays if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
    return jnp.result_type(*dts) if dts else jnp.float32


def _qkv(Q, K, V):
    """Q, K, V as arrays of one floating dtype, checked to be square of the same size."""
    dt = _dtype_of(*(a for a in (Q, K, V) if hasattr(a, "dtype")))
    Q, K, V = (_as_array(a, None if hasattr(a, "dtype") else dt) for a in (Q, K, V))
    _check_square("Q", Q)
    d = Q.shape[0]
    _check_square("K", K, d)
    _check_square("V", V, d)
    return Q, K, V


class AbstractParticleModel(eqx.Module):
    """Base of all particle fields: ``__call__(t, x, args) -> dx/dt`` with x of shape (N, d)."""

    manifold: ClassVar[str] = "euclidean"

    @property
    def dim(self) -> int:
        raise NotImplementedError


class AbstractQKVModel(AbstractParticleModel):
    """Sphere fields built from attention weights Q, K, V (B = QᵀK)."""

    manifold: ClassVar[str] = "sphere"
    Q: jax.Array
    K: jax.Array
    V: jax.Array

    @property
    def dim(self) -> int:
        return self.Q.shape[0]

    @property
    def B(self):
        return jnp.matmul(self.Q.T, self.K, precision=HIGHEST)


class SphereAttention(AbstractQKVModel):
    r"""Softmax self-attention dynamics on the sphere (Paper A, Eq. 2 for the empirical measure).

        ẋ_i = P⊥(x_i) V Σ_j w_ij x_j,   w_ij = exp(β x_iᵀ B x_j) / Σ_k exp(β x_iᵀ B x_k),
        B = Qᵀ K,  P⊥(x) = I − x xᵀ.

    ``normalization="unnormalized"`` gives USA (w_ij = exp(β x_iᵀBx_j)/N) and
    ``"hardmax"`` attends to argmax_j x_iᵀ B x_j (β = ∞ on the empirical measure).

    Args:
      Q, K, V: (d, d) arrays.
      beta: inverse temperature β > 0 (an array leaf: vmap over a stack of models sweeps β).
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"`` (see :func:`jaxdyn.interaction`).
      k_block, q_block: blocked-kernel block sizes (None: the platform's tuned default).
    """

    beta: jax.Array
    kernel: str = eqx.field(static=True, default="auto")
    normalization: str = eqx.field(static=True, default="softmax")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, *, kernel="auto", normalization="softmax", k_block=None,
                 q_block=None):
        self.Q, self.K, self.V = _qkv(Q, K, V)
        # a concrete β is cast on the host and moved (a cast on the device compiles a program)
        self.beta = (jax.device_put(np.asarray(beta, dtype=self.Q.dtype)) if _is_concrete(beta)
                     else jnp.asarray(beta, dtype=self.Q.dtype))
        if self.beta.ndim != 0:
            raise ValueError(f"beta must be a scalar, got shape {self.beta.shape}; to sweep β, vmap "
                             "over a stack of models (jaxdyn.stack_models)")
        if _is_concrete(self.beta):
            # on the host (``self.beta > 0`` on the device array would compile a program)
            if not float(np.asarray(self.beta)) > 0:
                raise ValueError(f"beta (inverse temperature) must be > 0, got {float(self.beta)}")
        else:  # built under jit/vmap (e.g. a β computed in a traced sweep): checked at run time
            self.beta = eqx.error_if(self.beta, ~(self.beta > 0),
                                     "SphereAttention: beta (inverse temperature) must be > 0")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        self.kernel = kernel
        self.normalization = normalization
        self.k_block = None if k_block is None else int(k_block)
        self.q_block = None if q_block is None else int(q_block)

    def ambient(self, t, x, args=None):
        """The field before the tangent projection: a_i = V Σ_j w_ij x_j (so that
        ``__call__ = P⊥(x) ambient``); the step of ``method="euler_renormalise"``."""
        m = interaction(x, x, self.B, self.beta, normalization=self.normalization,
                        kernel=self.kernel, k_block=self.k_block, q_block=self.q_block)
        return jnp.matmul(m, self.V.T, precision=HIGHEST)

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))


class ZeroTemperature(AbstractQKVModel):
    r"""Zero-temperature limit field (Paper A, Eq. 3), local (no interaction):

        X_∞(x) = P⊥(x) V Bᵀx / |Bᵀx| = P⊥(x) M x / |Bᵀx|,   M = V Bᵀ,  B = QᵀK.

    Valid while ρ has full support (Assumption 3). Its flow converges to Π(x0) (docs/math.md §A.4).
    """

    def __init__(self, Q, K, V):
        self.Q, self.K, self.V = _qkv(Q, K, V)

    def ambient(self, t, x, args=None):
        """The field before the tangent projection: V Bᵀx / |Bᵀx|."""
        bx = jnp.matmul(x, self.B, precision=HIGHEST)  # rows: (Bᵀ x_i)ᵀ
        y = bx / jnp.linalg.norm(bx, axis=-1, keepdims=True)
        return jnp.matmul(y, self.V.T, precision=HIGHEST)

    def __call__(self, t, x, args=None):
        return tangent_project(x, self.ambient(t, x, args))


class EuclideanAttention(AbstractParticleModel):
    r"""Attention plus affine feed-forward in R^d (Paper B), with constant or time-varying
    parameters:

        ẋ_i = A(t) σ(x_i) + b(t) + V(t) Σ_j w_ij x_j,
        w_ij = exp(x_jᵀ B(t) x_i) / Σ_k exp(x_kᵀ B(t) x_i),

    with σ = identity (Gaussians stay Gaussian) or ReLU. The inverse temperature is absorbed
    in B. In Q/K terms B = Kᵀ Q.

    ``A, B, V``: (d, d) arrays or :class:`~jaxdyn.models.Control` (values (n, d, d));
    ``b``: (d,) array, Control or None (0). With Controls it is the particle field of the
    controlled moment system (:func:`jaxdyn.gaussian.solve_moments` with the same controls
    follows a Gaussian cloud's moments up to Monte-Carlo error); ``at(t)`` freezes them.
    ``jaxdyn.control.ControlledEuclideanAttention`` is this class.
    """

    manifold: ClassVar[str] = "euclidean"
    A: Union[jax.Array, Control]
    B: Union[jax.Array, Control]
    V: Union[jax.Array, Control]
    b: Union[jax.Array, Control]
    activation: str = eqx.field(static=True, default="identity")
    kernel: str = eqx.field(static=True, default="auto")

    def __init__(self, A, B, V, b=None, *, activation="identity", kernel="auto"):
        dt = _dtype_of(*(a for a in (A, B, V) if hasattr(a, "dtype")))

        def conv(p):
            if isinstance(p, Control):
                return p
            return _as_array(p, None if hasattr(p, "dtype") else dt)

        A, B, V = conv(A), conv(B), conv(V)
        sA = tuple(A.shape)
        if len(sA) != 2 or sA[0] != sA[1]:
            raise ValueError(f"A must be a square matrix of shape (d, d) (or a Control with values "
                             f"(n, d, d)), got shape {sA}")
        d = sA[0]
        for name, p in (("B", B), ("V", V)):
            if tuple(p.shape) != (d, d):
                raise ValueError(f"{name} must have shape ({d}, {d}) (or be a Control with values "
                                 f"(n, {d}, {d})), got shape {tuple(p.shape)}")
        if b is None:
            b = jnp.zeros((d,), A.dtype)
        elif not isinstance(b, Control):
            b = jnp.asarray(b, A.dtype)
        if tuple(b.shape) != (d,):
            raise ValueError(f"b must have shape ({d},) (or be a Control with values (n, {d})), "
                             f"got {tuple(b.shape)}")
        if activation not in ("identity", "relu"):
            raise ValueError(f"activation must be 'identity' or 'relu', got {activation!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.A, self.B, self.V, self.b = A, B, V, b
        self.activation = activation
        self.kernel = kernel

    @classmethod
    def from_controls(cls, controls: Mapping, *, activation="identity", kernel: str = "auto"):
        """From ``{"A", "B", "V", "b"}`` (e.g. ``ReachResult.controls``)."""
        return cls(controls["A"], controls["B"], controls["V"], controls.get("b"),
                   activation=activation, kernel=kernel)

    @property
    def dim(self) -> int:
        return self.A.shape[0]

    def params(self, t):
        """``(A, B, V, b)`` at time t."""
        return at(self.A, t), at(self.B, t), at(self.V, t), at(self.b, t)

    def at(self, t) -> "EuclideanAttention":
        """The field with its Controls frozen at time t (constant arrays)."""
        A, B, V, b = self.params(t)
        return EuclideanAttention(A, B, V, b, activation=self.activation, kernel=self.kernel)

    def __call__(self, t, x, args=None):
        A, B, V, b = self.params(t)
        # logits_ij = x_jᵀ B x_i = x_iᵀ Bᵀ x_j  →  interaction with bilinear form Bᵀ, β = 1.
        m = interaction(x, x, B.T, 1.0, kernel=self.kernel)
        h = jax.nn.relu(x) if self.activation == "relu" else x
        return (jnp.matmul(h, A.T, precision=HIGHEST) + b
                + jnp.matmul(m, V.T, precision=HIGHEST))


def stack_models(models):
    """Stack a list of models with equal static structure into one batched model, ready for
    ``jax.vmap`` (e.g. a β sweep: ``[SphereAttention(Q, K, V, b) for b in betas]``)."""
    models = list(models)
    if not models:
        raise ValueError("stack_models needs at least one model")
    flat = [jax.tree.flatten(m) for m in models]
    first = flat[0][1]
    for i, (m, (_, tdef)) in enumerate(zip(models[1:], flat[1:]), 1):
        if type(m) is not type(models[0]):
            raise ValueError(f"stack_models: model {i} is a {type(m).__name__}, model 0 a "
                             f"{type(models[0]).__name__}; stack models of one type")
        if tdef != first:
            diff = [f.name for f in dataclasses.fields(m)
                    if not _same_static(getattr(m, f.name, None), getattr(models[0], f.name, None))]
            raise ValueError(f"stack_models: model {i} differs from model 0 in its static fields "
                             f"({', '.join(diff) or 'structure'}: e.g. kernel='dense' vs 'blocked'); "
                             "stack models that differ only in their arrays")
    columns = zip(*(leaves for leaves, _ in flat))
    return jax.tree.unflatten(first, [_stack_leaves(col) for col in columns])


def _stack_leaves(leaves):
    """One stacked leaf. Concrete arrays are stacked on the host and moved to the device in
    one transfer (``jnp.stack`` over thousands of separate device arrays costs ~10 ms each);
    traced leaves (under ``jit``/``vmap``), weakly typed ones and arrays of several processes
    use ``jnp.stack``, which keeps their weak type (a weak β must not promote a float32
    cloud) and their sharding."""
    host = []
    for a in leaves:
        if isinstance(a, np.ndarray):
            host.append(a)
        elif isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and not a.weak_type:
            try:
                host.append(np.asarray(a))
            except RuntimeError:  # not addressable from this process
                return jnp.stack(leaves)
        else:
            return jnp.stack(leaves)
    return jnp.asarray(np.stack(host))


def _same_static(a, b):
    if hasattr(a, "shape") or hasattr(b, "shape"):
        return getattr(a, "shape", None) == getattr(b, "shape", None)
    try:
        return bool(a == b)
    except Exception:  # pragma: no cover
        return a is b
