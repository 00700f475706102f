"""Kind ``gaussianity``: encode Gaussian inputs layer by layer and measure the distance from
the moment-matched Gaussian (:mod:`jaxdyn.encoder`)."""

from __future__ import annotations

import jax
import numpy as np

from .schema import arch_config, load_model, model_path


def run_points(pcs):
    from ...encoder import (encode, encode_deit, encode_modernbert, gaussian_tokens, gaussianity_profile,
                            init_deit, init_modernbert, nongaussian_stack, random_like)

    rows = []
    for pc in pcs:
        k_in, k_w, k_c, k_p = jax.random.split(jax.random.PRNGKey(pc["seed"]), 4)
        if pc["architecture"] != "bert":  # Paper B's own architectures: random weights only
            bcfg = arch_config(pc)
            h0 = gaussian_tokens(k_in, pc["batch"], pc["seq"], bcfg.hidden_size, pc["scale"])
            if pc["model"] == "random":
                init, enc = ((init_modernbert, encode_modernbert) if pc["architecture"] == "modernbert"
                             else (init_deit, encode_deit))
                hs = enc(init(bcfg, k_w), bcfg, h0)
            else:
                hs = nongaussian_stack(h0, k_c, n_layers=bcfg.num_hidden_layers, kind=pc["control_kind"])
            rows.append(gaussianity_profile(hs, k_p, n_dirs=pc["n_dirs"], n_floor=pc["n_floor"],
                                            n_pc=pc["n_pc"]))
            continue
        params, bcfg = load_model(str(model_path(pc)))
        h0 = gaussian_tokens(k_in, pc["batch"], pc["seq"], bcfg.hidden_size, pc["scale"])
        if pc["model"] == "pretrained":
            hs = encode(params, bcfg, h0)
        elif pc["model"] == "random":
            hs = encode(random_like(params, k_w), bcfg, h0)
        else:
            hs = nongaussian_stack(h0, k_c, n_layers=bcfg.num_hidden_layers, kind=pc["control_kind"])
        prof = gaussianity_profile(hs, k_p, n_dirs=pc["n_dirs"], n_floor=pc["n_floor"], n_pc=pc["n_pc"])
        rows.append(prof)
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
