"""Weight ensembles (Q, K, V) for sphere experiments: named builders over a plain dict of options.

``weights: {ensemble: NAME, ...}`` with NAME one of :data:`ENSEMBLES`. Each builder takes
the section and the dimension d and returns three (d, d) float64 NumPy arrays (cast by the
caller). Seeds are explicit (``weights.seed``, default 0), separate from the particle seed;
``scale`` and ``sign`` default to 1. Host-only and JAX-free (``jaxdyn config`` builds weights
without loading JAX).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENSEMBLES", "WeightsError", "build_weights", "register"]

#: name -> builder ``fn(spec, d) -> (Q, K, V)``
ENSEMBLES: dict = {}


class WeightsError(ValueError):
    """A weight specification that cannot be built.

    The message names the field (``weights.<name>``), as a config section would.
    """


def register(name):
    """Register a builder ``fn(spec, d) -> (Q, K, V)`` under ``name`` (a decorator).

    Args:
      name: the ensemble's name in a ``weights`` section.

    Returns:
      The decorator, which returns the builder unchanged.
    """
    def deco(fn):
        ENSEMBLES[name] = fn
        return fn

    return deco


@register("identity")
def _identity(spec, d):
    """Q = K = V = I."""
    eye = np.eye(d)
    return eye, eye.copy(), eye.copy()


@register("gaussian")
def _gaussian(spec, d):
    """Entries i.i.d. N(0, scale²/d) (independent Q, K, V)."""
    rng = np.random.default_rng(spec.get("seed", 0))
    s = spec.get("scale", 1.0) / np.sqrt(d)
    return tuple(s * rng.normal(size=(d, d)) for _ in range(3))


@register("goe")
def _goe(spec, d):
    """Independent GOE/Wigner matrices scale·(G + Gᵀ)/√(2d): semicircle spectrum on [−2s, 2s]."""
    rng = np.random.default_rng(spec.get("seed", 0))
    out = []
    for _ in range(3):
        g = rng.normal(size=(d, d))
        out.append(spec.get("scale", 1.0) * (g + g.T) / np.sqrt(2 * d))
    return tuple(out)


@register("kq")
def _kq(spec, d):
    """Gaussian Q, K (entries N(0, scale²/d)) and V = sign · KᵀQ (Geshkovski et al.'s examples)."""
    rng = np.random.default_rng(spec.get("seed", 0))
    s = spec.get("scale", 1.0) / np.sqrt(d)
    Q, K = s * rng.normal(size=(d, d)), s * rng.normal(size=(d, d))
    return Q, K, spec.get("sign", 1.0) * K.T @ Q


@register("spectral")
def _spectral(spec, d):
    """Q = I, K = B, V = M B^{-T}, M = U diag(mu) Uᵀ: Assumption 1 by construction (B a rotation)."""
    from .spectral_host import spectral_weights_host

    mu = spec.get("mu")
    if mu is None:
        raise WeightsError("config field 'weights.mu' is required for ensemble 'spectral' "
                          f"(d = {d} eigenvalues of M = VBᵀ)")
    if len(mu) != d:
        raise WeightsError(f"config field 'weights.mu': expected {d} eigenvalues (d = {d}), got {len(mu)}")
    if spec.get("rotation") is not None and spec.get("eigenspace_angle_deg") is not None:
        raise WeightsError("config fields 'weights.rotation' and 'weights.eigenspace_angle_deg': "
                          "give at most one")
    angle = spec.get("eigenspace_angle_deg")
    try:  # float64 NumPy, no JAX (the config check builds the weights)
        sw = spectral_weights_host(
            mu, rotation=spec.get("rotation"),
            eigenspace_angle=None if angle is None else np.deg2rad(angle),
            plane=spec.get("plane"), seed=spec.get("seed", 0) if spec.get("random_basis") else None)
    except ValueError as e:
        raise WeightsError(f"config section 'weights' (spectral): {e}") from None
    return tuple(np.asarray(a, np.float64) for a in (sw.Q, sw.K, sw.V))


@register("explicit")
def _explicit(spec, d):
    """The matrices given as ``weights.Q``, ``weights.K``, ``weights.V``."""
    out = []
    for name in ("Q", "K", "V"):
        m = spec.get(name)
        if m is None:
            raise WeightsError(f"config field 'weights.{name}' is required for ensemble 'explicit'")
        m = np.asarray(m, float)
        if m.shape != (d, d):
            raise WeightsError(f"config field 'weights.{name}': expected a {d}×{d} matrix (d = {d}), "
                              f"got shape {m.shape}")
        out.append(m)
    return tuple(out)


#: fields of a ``weights`` section that only one built-in ensemble reads: given with another
#: ensemble they were ignored without a word (explicit Q, K, V under the default 'identity')
_OWN_FIELDS = {"explicit": ("Q", "K", "V"),
               "spectral": ("mu", "rotation", "eigenspace_angle_deg", "plane")}


def build_weights(spec: dict, d: int):
    """(Q, K, V) as float64 NumPy arrays from a ``weights`` section.

    Args:
      spec: the section: ``ensemble`` (default ``"identity"``) and its options.
      d: the dimension.

    Returns:
      ``(Q, K, V)``, three (d, d) float64 NumPy arrays.

    Raises:
      WeightsError: for an unknown ensemble, fields another ensemble reads, or a section the
        ensemble cannot build (the message names the field).
    """
    name = spec.get("ensemble", "identity")
    if name not in ENSEMBLES:
        raise WeightsError(f"config field 'weights.ensemble': unknown ensemble {name!r}; "
                          f"known: {sorted(ENSEMBLES)}")
    for owner, fields in _OWN_FIELDS.items():
        given = [f for f in fields if spec.get(f) is not None]
        if owner != name and given:
            raise WeightsError(
                f"config field{'s' if len(given) > 1 else ''} "
                f"{', '.join(repr('weights.' + f) for f in given)}: read by ensemble {owner!r} "
                f"only, but weights.ensemble is {name!r}; set 'weights.ensemble: {owner}' or "
                "remove them")
    scale = spec.get("scale")
    if scale is not None and not (isinstance(scale, (int, float, np.integer, np.floating))
                                  and not isinstance(scale, (bool, np.bool_))
                                  and np.isfinite(scale) and scale > 0):
        raise WeightsError(f"config field 'weights.scale' must be a finite number > 0, got {scale!r}")
    return ENSEMBLES[name](spec, d)
