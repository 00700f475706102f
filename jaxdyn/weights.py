"""Weight ensembles (Q, K, V) for sphere experiments: named builders over a plain dict of options.

``weights: {ensemble: NAME, ...}`` with NAME one of :data:`ENSEMBLES`. Each builder takes
the section, the dimension d and a NumPy dtype and returns three (d, d) float64 NumPy arrays
(cast by the caller). Seeds are explicit (``weights.seed``), separate from the particle seed.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np


ENSEMBLES: Dict[str, Callable] = {}


class WeightsError(ValueError):
    """A weight specification that cannot be built; the message names the field
    (``weights.<name>``), as a config section would."""



def register(name):
    def deco(fn):
        ENSEMBLES[name] = fn
        return fn

    return deco


@register("identity")
def _identity(spec, d):
    eye = np.eye(d)
    return eye, eye.copy(), eye.copy()


@register("gaussian")
def _gaussian(spec, d):
    """Entries i.i.d. N(0, scale²/d) (independent Q, K, V)."""
    rng = np.random.default_rng(spec["seed"])
    s = spec["scale"] / np.sqrt(d)
    return tuple(s * rng.normal(size=(d, d)) for _ in range(3))


@register("goe")
def _goe(spec, d):
    """Independent GOE/Wigner matrices (G + Gᵀ)/√(2d), times scale: symmetric, semicircle
    spectrum on [−2·scale, 2·scale]."""
    rng = np.random.default_rng(spec["seed"])
    out = []
    for _ in range(3):
        g = rng.normal(size=(d, d))
        out.append(spec["scale"] * (g + g.T) / np.sqrt(2 * d))
    return tuple(out)


@register("kq")
def _kq(spec, d):
    """Gaussian Q, K (entries N(0, scale²/d)) and V = sign · KᵀQ (``sign`` = ±1), the
    choice of Geshkovski–Letrouit–Polyanskiy–Rigollet's examples."""
    rng = np.random.default_rng(spec["seed"])
    s = spec["scale"] / np.sqrt(d)
    Q, K = s * rng.normal(size=(d, d)), s * rng.normal(size=(d, d))
    return Q, K, spec["sign"] * K.T @ Q


@register("spectral")
def _spectral(spec, d):
    """Q = I, K = B, V = M B^{-T} with M = U diag(mu) Uᵀ (Paper A's Assumption 1 by
    construction); B a rotation (``rotation`` rad, or ``eigenspace_angle_deg`` between E(VBᵀ)
    and E(V)) in the ``plane`` of two eigenvectors; B = I if neither is given."""
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
            plane=spec.get("plane"), seed=spec["seed"] if spec.get("random_basis") else None)
    except ValueError as e:
        raise WeightsError(f"config section 'weights' (spectral): {e}") from None
    return tuple(np.asarray(a, np.float64) for a in (sw.Q, sw.K, sw.V))


@register("explicit")
def _explicit(spec, d):
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
    """(Q, K, V) as float64 NumPy arrays from a validated ``weights`` section."""
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
    return ENSEMBLES[name](spec, d)
