"""Particle vector fields as equinox Modules.

Each model is a vector field ``field(t, x, args) -> dx/dt`` on a cloud ``x`` of shape
(N, d), usable as a ``diffrax.ODETerm`` and by :func:`jaxdyn.simulate`. Parameters are
array leaves, so ``jax.vmap`` over a stack of models is a parameter sweep and ``jax.grad``
with respect to a model is control. ``manifold`` ("sphere" or "euclidean") tells the
integrators whether to retract onto S^{d-1}.

Every model can be built inside ``jax.jit`` (or ``jax.export``) from NumPy or traced weights:
concrete values are checked on the host (a ``ValueError`` naming the parameter), traced ones by
the program, through :meth:`AbstractParticleModel.invalid`, which the drivers turn into
``RESULTS.invalid_input``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Mapping, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..kernels._attention import (HIGHEST, KERNELS, NORMALIZATIONS, check_local, interaction,
                                  local_interaction)
from ..kernels._local import DEFAULT_TOL
from ..sphere import tangent_project
from ._control import Control, at
from ._params import Domain, float_dtype, invalid_parameters, is_traced, parameter, to_array


def check_shape(name: str, a, shape: tuple, what: str = "") -> None:
    """Raise unless ``a`` has exactly ``shape``.

    Args:
      name: the argument's name, as the error message shows it.
      a: an array, a tracer or a :class:`~jaxdyn.models.Control` (its values' shape per time).
      shape: the shape it must have.
      what: what the shape means, appended to the message.

    Raises:
      ValueError: naming ``name``, the expected and the given shape.
    """
    got = tuple(np.shape(a)) if not hasattr(a, "shape") else tuple(a.shape)
    if got != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}{what}, got {got}")


def _check_square(name, a, d=None):
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1] or (d is not None and shape[0] != d):
        want = f"({d}, {d})" if d is not None else "(d, d)"
        raise ValueError(f"{name} must be a square matrix of shape {want}, got shape {shape}")


def weights(*arrays):
    """Weight arrays in one floating dtype (the one they promote to), without device work.

    Args:
      *arrays: array-likes or tracers (Python lists and integer arrays take the others' dtype,
        float32 when none has a floating one).

    Returns:
      The arrays as JAX arrays (or tracers) of one floating dtype, in the given order.
    """
    dt = float_dtype(*arrays)
    return tuple(to_array(a, dt) for a in arrays)


def _qkv(Q, K, V):
    """Q, K, V as arrays of one floating dtype, checked to be square of the same size."""
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        if not hasattr(a, "shape"):
            a = np.asarray(a)
        _check_square(name, a, None if name == "Q" else np.shape(Q)[0])
    return weights(Q, K, V)


def kernel_options(kernel: str, k_block, q_block, tol=DEFAULT_TOL, capacity=None) -> tuple:
    """The kernel choice and its options of an attention model, checked.

    Args:
      kernel: ``"dense"``, ``"blocked"``, ``"local"`` or ``"auto"`` (see
        :func:`jaxdyn.kernels.interaction`).
      k_block: key block size of the blocked kernel (None: the platform's default).
      q_block: query block size of the blocked kernel (None: the platform's default).
      tol: the local kernel's tolerance, in (0, 1).
      capacity: the local kernel's list capacity (None: its default).

    Returns:
      ``(kernel, k_block, q_block, tol, capacity)`` with the sizes as Python ints (or None).

    Raises:
      ValueError: for an unknown kernel, a block size that is not an integer >= 1, or a bad
        ``tol``/``capacity``.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    blocks = []
    for name, b in (("k_block", k_block), ("q_block", q_block)):
        if b is not None and (isinstance(b, bool) or int(b) != b or int(b) < 1):
            raise ValueError(f"{name} must be an integer >= 1 (or None), got {b!r}")
        blocks.append(None if b is None else int(b))
    return (kernel, *blocks, *check_local(tol, capacity))


class AbstractParticleModel(eqx.Module):
    """Base of every particle field: ``__call__(t, x, args) -> dx/dt`` with x of shape (N, d).

    Attributes:
      manifold: class attribute, ``"euclidean"`` or ``"sphere"``: where the state lives (the
        integrators retract onto S^{d-1} for ``"sphere"``).
      domains: class attribute, the value-constrained parameters (name → :class:`Domain`):
        checked on the host when concrete, reported by :meth:`invalid` when traced.
    """

    manifold: ClassVar[str] = "euclidean"
    domains: ClassVar[Mapping[str, Domain]] = {}

    @property
    def dim(self) -> int:
        """The dimension d of the particles."""
        raise NotImplementedError

    def invalid(self):
        """Whether a parameter of the model lies outside its domain (e.g. a traced β <= 0).

        Concrete parameters are refused on the host when the model is built; a traced one (a β
        computed under ``jit`` or swept under ``vmap``) cannot be, so the drivers
        (``jaxdyn.simulate`` and the others) OR this flag into their result as
        ``RESULTS.invalid_input``. Sub-models (a LayerNorm placement's ``field``) and
        :class:`~jaxdyn.models.Control` parameters are included. Non-finite weights (Q, K, V)
        are not flagged here: they make the state non-finite, which the drivers report.

        Returns:
          A boolean array: a scalar for one model, the stack's shape for a stack of models
          (``stack_models``); NumPy when every parameter involved is concrete.
        """
        return invalid_parameters(self)


class AbstractSphereModel(AbstractParticleModel):
    """A field on S^{d-1}: the tangent projection of an ambient field, ẋ_i = P⊥(x_i) a_i(x).

    Attributes:
      manifold: ``"sphere"`` (class attribute).
    """

    manifold: ClassVar[str] = "sphere"

    @abc.abstractmethod
    def ambient(self, t, x, args=None):
        """The field before the tangent projection (the step of ``method="euler_renormalise"``).

        Args:
          t: time.
          x: (N, d) points (unit rows on the sphere).
          args: unused (diffrax's signature).
        """

    def __call__(self, t, x, args=None):
        """ẋ = P⊥(x) a(t, x): the ambient field projected onto the tangent spaces.

        Args:
          t: time.
          x: (N, d) points on S^{d-1}.
          args: unused (diffrax's signature).

        Returns:
          dx/dt, shape (N, d), tangent at every row of x.
        """
        return tangent_project(x, self.ambient(t, x, args))


class AbstractAttentionModel(AbstractSphereModel):
    """Attention on the sphere from weights Q, K, V (their last axis is the dimension d).

    Attributes:
      Q: query weights.
      K: key weights.
      V: value weights.
    """

    Q: jax.Array
    K: jax.Array
    V: jax.Array

    @property
    def dim(self) -> int:
        """The dimension d of the particles (Q's last axis)."""
        return self.Q.shape[-1]


class AbstractQKVModel(AbstractAttentionModel):
    """Sphere fields built from (d, d) attention weights Q, K, V (B = QᵀK).

    Attributes:
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.
    """

    @property
    def B(self):
        """The bilinear form B = QᵀK of the attention logits x_iᵀ B x_j."""
        return jnp.matmul(self.Q.T, self.K, precision=HIGHEST)


class SphereAttention(AbstractQKVModel):
    r"""Softmax self-attention dynamics on the sphere (Paper A, Eq. 2 for the empirical measure).

        ẋ_i = P⊥(x_i) V Σ_j w_ij x_j,   w_ij = exp(β x_iᵀ B x_j) / Σ_k exp(β x_iᵀ B x_k),
        B = Qᵀ K,  P⊥(x) = I − x xᵀ.

    ``normalization="unnormalized"`` gives USA (w_ij = exp(β x_iᵀBx_j)/N) and
    ``"hardmax"`` attends to argmax_j x_iᵀ B x_j (β = ∞ on the empirical measure).

    Args:
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.
      beta: inverse temperature β > 0, finite (an array leaf: vmap over a stack of models sweeps
        β; a traced β <= 0 is reported by :meth:`invalid`).
      kernel: ``"dense"`` | ``"blocked"`` | ``"local"`` | ``"auto"`` (see
        :func:`jaxdyn.interaction`; ``"local"``: softmax weights only).
      normalization: ``"softmax"`` | ``"unnormalized"`` | ``"hardmax"``.
      k_block: blocked-kernel key block size (None: the platform's tuned default).
      q_block: blocked-kernel query block size (None: the platform's tuned default).
      tol: the local kernel's certified error bound relative to ``max_j |x_j|``
        (:func:`jaxdyn.local_interaction`).
      capacity: the local kernel's list capacity (None: its default).

    Raises:
      ValueError: for weights that are not (d, d), a concrete β that is not finite and > 0, an
        unknown kernel or normalization, ``"local"`` with other than softmax weights, or a bad
        ``tol``/``capacity``.
    """

    domains: ClassVar[Mapping[str, Domain]] = {"beta": Domain("positive", 0, "inverse temperature")}
    beta: jax.Array
    kernel: str = eqx.field(static=True, default="auto")
    normalization: str = eqx.field(static=True, default="softmax")
    k_block: Optional[int] = eqx.field(static=True, default=None)
    q_block: Optional[int] = eqx.field(static=True, default=None)
    tol: float = eqx.field(static=True, default=DEFAULT_TOL)
    capacity: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, beta, *, kernel="auto", normalization="softmax", k_block=None,
                 q_block=None, tol=DEFAULT_TOL, capacity=None):
        self.Q, self.K, self.V = _qkv(Q, K, V)
        self.beta = parameter(SphereAttention, "beta", beta, self.Q.dtype)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if kernel == "local" and normalization != "softmax":
            raise ValueError(f"kernel='local' serves softmax weights only, got normalization="
                             f"{normalization!r}")
        self.normalization = normalization
        (self.kernel, self.k_block, self.q_block, self.tol,
         self.capacity) = kernel_options(kernel, k_block, q_block, tol, capacity)

    def ambient(self, t, x, args=None):
        """a_i = V Σ_j w_ij x_j for x of shape (N, d): the field before the tangent projection."""
        m = interaction(x, x, self.B, self.beta, normalization=self.normalization,
                        kernel=self.kernel, k_block=self.k_block, q_block=self.q_block,
                        tol=self.tol, capacity=self.capacity)
        return jnp.matmul(m, self.V.T, precision=HIGHEST)

    def local_stats(self, x, t=0.0):
        """The local kernel's certificate at the particles x (:func:`jaxdyn.local_interaction`).

        Args:
          x: (N, d) particles.
          t: time (unused: the field is autonomous).

        Returns:
          :class:`jaxdyn.kernels.LocalStats` of the attention average at x.
        """
        return local_interaction(x, x, self.B, self.beta, tol=self.tol,
                                 capacity=self.capacity)[1]


class ZeroTemperature(AbstractQKVModel):
    r"""Zero-temperature limit field (Paper A, Eq. 3), local (no interaction).

        X_∞(x) = P⊥(x) V Bᵀx / |Bᵀx| = P⊥(x) M x / |Bᵀx|,   M = V Bᵀ,  B = QᵀK.

    Valid while ρ has full support (Assumption 3). Its flow converges to Π(x0) (docs/math.md §A.4).

    Args:
      Q: (d, d) query weights.
      K: (d, d) key weights.
      V: (d, d) value weights.

    Raises:
      ValueError: for weights that are not (d, d) of one d.
    """

    def __init__(self, Q, K, V):
        self.Q, self.K, self.V = _qkv(Q, K, V)

    def ambient(self, t, x, args=None):
        """V Bᵀx / |Bᵀx| row-wise: the zero-temperature field before the tangent projection."""
        bx = jnp.matmul(x, self.B, precision=HIGHEST)  # rows: (Bᵀ x_i)ᵀ
        y = bx / jnp.linalg.norm(bx, axis=-1, keepdims=True)
        return jnp.matmul(y, self.V.T, precision=HIGHEST)


class EuclideanAttention(AbstractParticleModel):
    r"""Attention plus affine feed-forward in R^d (Paper B), constant or time-varying parameters.

        ẋ_i = A(t) σ(x_i) + b(t) + V(t) Σ_j w_ij x_j,
        w_ij = exp(x_jᵀ B(t) x_i) / Σ_k exp(x_kᵀ B(t) x_i),

    with σ = identity (Gaussians stay Gaussian) or ReLU. The inverse temperature is absorbed
    in B. In Q/K terms B = Kᵀ Q.

    With Controls it is the particle field of the controlled moment system
    (:func:`jaxdyn.gaussian.solve_moments` with the same controls follows a Gaussian cloud's
    moments up to Monte-Carlo error); ``at(t)`` freezes them.
    ``jaxdyn.control.ControlledEuclideanAttention`` is this class.

    Args:
      A: (d, d) array or :class:`~jaxdyn.models.Control` (values (n, d, d)).
      B: (d, d) array or Control.
      V: (d, d) array or Control.
      b: (d,) array, Control (values (n, d)) or None (0).
      activation: ``"identity"`` or ``"relu"`` (σ).
      kernel: ``"dense"`` | ``"blocked"`` | ``"auto"``.

    Raises:
      ValueError: for shapes that do not fit one d, an unknown activation or kernel.
    """

    A: Union[jax.Array, Control]
    B: Union[jax.Array, Control]
    V: Union[jax.Array, Control]
    b: Union[jax.Array, Control]
    activation: str = eqx.field(static=True, default="identity")
    kernel: str = eqx.field(static=True, default="auto")
    tol: float = eqx.field(static=True, default=DEFAULT_TOL)
    capacity: Optional[int] = eqx.field(static=True, default=None)

    def __init__(self, A, B, V, b=None, *, activation="identity", kernel="auto", tol=DEFAULT_TOL,
                 capacity=None):
        dt = float_dtype(A, B, V)

        def conv(p):
            return p if isinstance(p, Control) else to_array(p, dt)

        A, B, V = conv(A), conv(B), conv(V)
        sA = tuple(A.shape)
        if len(sA) != 2 or sA[0] != sA[1]:
            raise ValueError(f"A must be a square matrix of shape (d, d) (or a Control with values "
                             f"(n, d, d)), got shape {sA}")
        d = sA[0]
        for name, p in (("B", B), ("V", V)):
            check_shape(name, p, (d, d), f" (or be a Control with values (n, {d}, {d}))")
        b = conv(np.zeros((d,), A.dtype) if b is None else b)
        check_shape("b", b, (d,), f" (or be a Control with values (n, {d}))")
        if activation not in ("identity", "relu"):
            raise ValueError(f"activation must be 'identity' or 'relu', got {activation!r}")
        self.A, self.B, self.V, self.b = A, B, V, b
        self.activation = activation
        self.kernel, _, _, self.tol, self.capacity = kernel_options(kernel, None, None, tol,
                                                                   capacity)

    @classmethod
    def from_controls(cls, controls: Mapping, *, activation="identity", kernel: str = "auto",
                      tol=DEFAULT_TOL, capacity=None):
        """The field of a dict of controls (e.g. ``ReachResult.controls``).

        Args:
          controls: ``{"A", "B", "V"}`` and optionally ``"b"``: arrays or Controls.
          activation: ``"identity"`` or ``"relu"``.
          kernel: ``"dense"`` | ``"blocked"`` | ``"local"`` | ``"auto"``.
          tol: the local kernel's tolerance.
          capacity: the local kernel's list capacity (None: its default).

        Returns:
          The :class:`EuclideanAttention` with those parameters.

        Raises:
          ValueError: ``controls`` lacks one of ``"A"``, ``"B"``, ``"V"``.
        """
        missing = [k for k in ("A", "B", "V") if k not in controls]
        if missing:
            raise ValueError(f"controls must hold 'A', 'B' and 'V' (and optionally 'b'); "
                             f"missing {missing}, got keys {sorted(controls)}")
        return cls(controls["A"], controls["B"], controls["V"], controls.get("b"),
                   activation=activation, kernel=kernel, tol=tol, capacity=capacity)

    @property
    def dim(self) -> int:
        """The dimension d."""
        return self.A.shape[-1]

    def params(self, t):
        """The parameters at time t.

        Args:
          t: time.

        Returns:
          ``(A, B, V, b)`` as arrays (Controls evaluated at t).
        """
        return at(self.A, t), at(self.B, t), at(self.V, t), at(self.b, t)

    def at(self, t) -> "EuclideanAttention":
        """The field with its Controls frozen at time t.

        Args:
          t: time.

        Returns:
          An :class:`EuclideanAttention` with constant arrays.
        """
        A, B, V, b = self.params(t)
        return EuclideanAttention(A, B, V, b, activation=self.activation, kernel=self.kernel,
                                  tol=self.tol, capacity=self.capacity)

    def __call__(self, t, x, args=None):
        """ẋ_i = A(t) σ(x_i) + b(t) + V(t) Σ_j w_ij x_j for x of shape (N, d) (class docstring)."""
        A, B, V, b = self.params(t)
        # logits_ij = x_jᵀ B x_i = x_iᵀ Bᵀ x_j  →  interaction with bilinear form Bᵀ, β = 1.
        m = interaction(x, x, B.T, 1.0, kernel=self.kernel, tol=self.tol,
                        capacity=self.capacity)
        h = jax.nn.relu(x) if self.activation == "relu" else x
        return (jnp.matmul(h, A.T, precision=HIGHEST) + b
                + jnp.matmul(m, V.T, precision=HIGHEST))

    def local_stats(self, x, t=0.0):
        """The local kernel's certificate at the particles x and time t.

        Args:
          x: (N, d) particles.
          t: time (Controls are evaluated at it).

        Returns:
          :class:`jaxdyn.kernels.LocalStats` of the attention average at x.
        """
        B = self.params(t)[1]
        return local_interaction(x, x, B.T, 1.0, tol=self.tol, capacity=self.capacity)[1]


def stack_models(models):
    """Stack models that differ only in their arrays into one batched model, ready for ``jax.vmap``.

    E.g. a β sweep: ``stack_models([SphereAttention(Q, K, V, b) for b in betas])``; every array
    leaf gains a leading axis of length ``len(models)``.

    Args:
      models: a non-empty sequence of models of one type, with equal static fields (kernel,
        normalization, ...) and equal array shapes.

    Returns:
      One model whose leaves are the stacked leaves.

    Raises:
      TypeError: for ``models`` that is a single model or not a sequence of models.
      ValueError: for an empty list, models of different types, static fields or array shapes.
    """
    if isinstance(models, eqx.Module) or not hasattr(models, "__iter__"):
        raise TypeError(f"stack_models takes a list of models, got a {type(models).__name__}; "
                        "pass [model] for a stack of one")
    models = list(models)
    if not models:
        raise ValueError("stack_models needs at least one model")
    flat = [jax.tree_util.tree_flatten_with_path(m) for m in models]
    first = flat[0][1]
    for i, (m, (leaves, tdef)) in enumerate(zip(models[1:], flat[1:]), 1):
        if type(m) is not type(models[0]):
            raise ValueError(f"stack_models: model {i} is a {type(m).__name__}, model 0 a "
                             f"{type(models[0]).__name__}; stack models of one type")
        if tdef != first:
            diff = [f.name for f in dataclasses.fields(m)
                    if not _same_static(getattr(m, f.name, None), getattr(models[0], f.name, None))]
            raise ValueError(f"stack_models: model {i} differs from model 0 in its static fields "
                             f"({', '.join(diff) or 'structure'}: e.g. kernel='dense' vs 'blocked'); "
                             "stack models that differ only in their arrays")
        for (path, a), (_, a0) in zip(leaves, flat[0][0]):
            if np.shape(a) != np.shape(a0):
                raise ValueError(f"stack_models: model {i}'s {jax.tree_util.keystr(path)[1:]} has "
                                 f"shape {np.shape(a)}, model 0's {np.shape(a0)}; stack models "
                                 "whose arrays have equal shapes")
    columns = zip(*([a for _, a in leaves] for leaves, _ in flat))
    return jax.tree.unflatten(first, [_stack_leaves(col) for col in columns])


def _stack_leaves(leaves):
    """One stacked leaf.

    Concrete arrays are stacked on the host and moved to the device in one transfer
    (``jnp.stack`` over thousands of separate device arrays is slow); traced leaves
    (under ``jit``/``vmap``), weakly typed ones and arrays of several processes use
    ``jnp.stack``, which keeps their weak type (a weak β must not promote a float32 cloud) and
    their sharding.

    Returns:
      The leaves stacked along a new leading axis.
    """
    host = []
    for a in leaves:
        if isinstance(a, np.ndarray):
            host.append(a)
        elif isinstance(a, jax.Array) and not is_traced(a) and not a.weak_type:
            try:
                host.append(np.asarray(a))
            except RuntimeError:  # not addressable from this process
                return jnp.stack(leaves)
        else:
            return jnp.stack(leaves)
    return jax.device_put(np.stack(host))


def _same_static(a, b):
    """Whether two static field values are equal (arrays: by shape)."""
    if hasattr(a, "shape") or hasattr(b, "shape"):
        return getattr(a, "shape", None) == getattr(b, "shape", None)
    try:
        return bool(a == b)
    except Exception:  # pragma: no cover
        return a is b
