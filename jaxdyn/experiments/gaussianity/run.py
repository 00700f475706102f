"""Kind ``gaussianity``: encode Gaussian inputs layer by layer; distance from the Gaussian.

Each layer's pooled cloud against the moment-matched Gaussian (:mod:`jaxdyn.encoder`).
"""

from __future__ import annotations

import jax
import numpy as np

from .schema import arch_config, load_model, model_path


def _encoder(pc):
    """The point's encoder pass and its inputs.

    Returns:
      ``(fn(params, h0) -> hidden states, params, h0, the key of the profile's directions)``.
    """
    from ...encoder import (encode, encode_deit, encode_modernbert, gaussian_tokens, init_deit,
                            init_modernbert, nongaussian_stack, random_like)

    k_in, k_w, k_c, k_p = jax.random.split(jax.random.PRNGKey(pc["seed"]), 4)
    if pc["architecture"] != "bert":  # Paper B's own architectures: random weights only
        bcfg = arch_config(pc)
        init, enc = ((init_modernbert, encode_modernbert) if pc["architecture"] == "modernbert"
                     else (init_deit, encode_deit))
        params = init(bcfg, k_w) if pc["model"] == "random" else None
    else:
        params, bcfg = load_model(str(model_path(pc)))
        enc = encode
        if pc["model"] == "random":
            params = random_like(params, k_w)
    h0 = gaussian_tokens(k_in, pc["batch"], pc["seq"], bcfg.hidden_size, pc["scale"])
    if pc["model"] == "nongaussian":
        def fn(prm, h):
            return nongaussian_stack(h, k_c, n_layers=bcfg.num_hidden_layers, kind=pc["control_kind"])
    else:
        def fn(prm, h):
            return enc(prm, bcfg, h)
    return fn, params, h0, k_p


def step_functions(pc):
    """The device computation of a point: the encoder pass of its Gaussian inputs.

    Args:
      pc: a point config.

    Returns:
      ``{"encoder": StepFunction}``: the hidden states of every layer from the inputs h0.
    """
    from ..kinds import StepFunction

    fn, params, h0, _ = _encoder(pc)
    return {"encoder": StepFunction(fn, (params, h0))}


def run_points(pcs):
    """Compute a chunk of ``gaussianity`` points (module doc; :meth:`~jaxdyn.experiments.ExperimentKind.run_points`)."""
    from ...encoder import gaussianity_profile

    rows = []
    for pc in pcs:
        fn, params, h0, k_p = _encoder(pc)
        hs = fn(params, h0)
        rows.append(gaussianity_profile(hs, k_p, n_dirs=pc["n_dirs"], n_floor=pc["n_floor"],
                                        n_pc=pc["n_pc"]))
    names = sorted(rows[0].values)
    vars_ = {}
    for name in names:
        dim = "step" if rows[0].values[name].shape[0] == len(hs) - 1 else "layer"
        for suffix, get in (("", lambda p: p.values[name]), ("_floor_mean", lambda p: p.floor_mean[name]),
                            ("_floor_std", lambda p: p.floor_std[name])):
            vars_[name + suffix] = ((dim,), np.stack([np.asarray(get(p)) for p in rows]))
    finite = np.array([all(np.all(np.isfinite(np.asarray(v))) for v in p.values.values()) for p in rows])
    vars_["finite"] = ((), finite)
    L = len(hs) - 1
    coords = {"layer": np.arange(L + 1), "step": np.arange(1, L + 1)}
    return vars_, coords
