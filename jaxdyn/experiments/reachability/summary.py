"""Kind ``reachability``: the summary per mode (reached, W2, energy, transfer)."""

from __future__ import annotations

import math

import numpy as np


def sweep_dims(ds):
    """The sweep axes of the Dataset (those of ``w2``)."""
    return [d for d in ds["w2"].dims]


def iter_points(ds):
    """Yield (labels, selection) for every grid point."""
    dims = sweep_dims(ds)
    shape = [ds.sizes[d] for d in dims]
    for idx in np.ndindex(*shape):
        sel = dict(zip(dims, idx))
        labels = {d: ds[d].values[i].item() if hasattr(ds[d].values[i], "item") else ds[d].values[i]
                  for d, i in sel.items()}
        yield labels, sel


def label_of(cfg, labels, key):
    """The point's value of field ``key`` (its sweep label, else the config's)."""
    return labels.get(key, cfg[key])


def groups(cfg, ds):
    """{(mode, d): [selection, …]} over the grid."""
    out = {}
    for labels, sel in iter_points(ds):
        key = (label_of(cfg, labels, "mode"), int(label_of(cfg, labels, "d")))
        out.setdefault(key, []).append((labels, sel))
    return out


def finite_or_none(x):
    """``float(x)`` if finite, else None."""
    x = float(x)
    return x if math.isfinite(x) else None


def summarize(cfg, ds):
    """The ``reachability`` results of ``summary.json`` (:meth:`~jaxdyn.experiments.ExperimentKind.summarize`)."""
    table = []
    for (mode, d), pts in sorted(groups(cfg, ds).items()):
        w2 = np.array([float(ds["w2"].isel(sel)) for _, sel in pts])
        reached = np.array([bool(ds["reached"].isel(sel)) for _, sel in pts])
        en = np.array([float(ds["energy"].isel(sel)) for _, sel in pts])
        cen = np.array([float(ds["certificate_energy"].isel(sel)) for _, sel in pts])
        cw2 = np.array([float(ds["certificate_w2"].isel(sel)) for _, sel in pts])
        wm = np.array([float(ds["w2_mean"].isel(sel)) for _, sel in pts])
        wc = np.array([float(ds["w2_cov"].isel(sel)) for _, sel in pts])
        it = np.array([float(ds["iterations"].isel(sel)) for _, sel in pts])
        sec = np.array([float(ds["seconds"].isel(sel)) for _, sel in pts])
        row = {
            "mode": mode, "d": d, "targets": len(pts),
            "reached_fraction": float(np.mean(reached)),
            "tol": cfg["tol"],
            "w2_median": finite_or_none(np.nanmedian(w2)), "w2_max": finite_or_none(np.nanmax(w2)),
            "w2_mean_part_median": finite_or_none(np.nanmedian(wm)), "w2_cov_part_median": finite_or_none(np.nanmedian(wc)),
            "energy_median": finite_or_none(np.nanmedian(en)),
            "energy_ratio_to_certificate_median": finite_or_none(np.nanmedian(en / cen)),
            "certificate_w2_max": finite_or_none(np.nanmax(cw2)),
            "iterations_median": finite_or_none(np.median(it)),
            "seconds_median": finite_or_none(np.median(sec)),
            # per target (the seeds of the group, in grid order): the spread behind the medians
            "per_target": {"seed": [int(label_of(cfg, lab, "seed")) for lab, _ in pts],
                           "reached": [bool(r) for r in reached],
                           "w2": [finite_or_none(x) for x in w2],
                           "energy_ratio_to_certificate": [finite_or_none(x) for x in en / cen],
                           "certificate_w2": [finite_or_none(x) for x in cw2]},
        }
        if mode == "bounded":
            row["bound"] = cfg["bound"]
        if mode == "energy":
            row["energy_weight_initial"] = cfg["energy_weight"]
        table.append(row)
    transfer = []
    for labels, sel in iter_points(ds):
        pb = ds["particle_w2_bures"].isel(sel).values
        if not np.any(np.isfinite(pb)):
            continue
        transfer.append({
            "mode": label_of(cfg, labels, "mode"), "d": int(label_of(cfg, labels, "d")),
            "seed": int(label_of(cfg, labels, "seed")),
            "moment_w2": finite_or_none(ds["w2"].isel(sel)),
            "n_particles": [int(n) for n in ds["n_particles"].values],
            "particle_w2_bures_moments": [finite_or_none(x) for x in pb],
            "particle_w2_bures_moments_exact_start": [
                finite_or_none(x) for x in ds["particle_w2_bures_exact_start"].isel(sel).values],
            "repeats": cfg["transfer"]["repeats"],
            # the smallest and largest over the repeats, where the run recorded them
            **{f"particle_w2_bures_moments_exact_start_{e}": [
                finite_or_none(x) for x in ds[f"particle_w2_bures_exact_start_{e}"].isel(sel).values]
               for e in ("min", "max") if f"particle_w2_bures_exact_start_{e}" in ds},
            "particle_w2_exact_vs_target_sample": [finite_or_none(x) for x in ds["particle_w2_exact"].isel(sel).values],
            "sampling_floor_exact": [finite_or_none(x) for x in ds["particle_w2_floor"].isel(sel).values],
            "initial_cloud_w2_bures": [finite_or_none(x) for x in ds["particle_w2_initial"].isel(sel).values],
            "layers": [int(n) for n in ds["layers"].values],
            "layer_n": cfg["transfer"]["layer_n"],
            "layer_w2_bures_moments": [finite_or_none(x) for x in ds["layer_w2_bures"].isel(sel).values],
            "layer_w2_exact_vs_target_sample": [finite_or_none(x) for x in ds["layer_w2_exact"].isel(sel).values],
            "continuous_limit_w2_bures_moments": finite_or_none(ds["layer_limit_w2_bures"].isel(sel)),
            "layer_rms_gap_to_continuous": [finite_or_none(x) for x in ds["layer_w2_gap"].isel(sel).values],
        })
    return {"modes": table, "transfer": transfer,
            "notes": ("Transfer '..._exact_start': the same initial draws whitened to the exact "
                      "initial moments, so the error is the one the finite-N dynamics add; the "
                      "L-layer runs start from such a cloud. "
                      "Transfer 'layer_rms_gap_to_continuous' is the RMS distance between each "
                      "particle after L layers and after the continuous-time flow from the same start "
                      "(an upper bound on the W2 between the two clouds; Euler: O(1/L)). "
                      "w2: Bures W2 at t1 of an independent Dopri8 solve (rtol 1e-11) of the "
                      "optimised controls; reached: w2 < tol. Transfer: 'bures_moments' compares the "
                      "cloud's empirical mean/covariance with the target; 'exact_vs_target_sample' is "
                      "the optimal-assignment W2 to an N-sample of the target, whose value for a "
                      "perfect cloud is 'sampling_floor_exact'.")}
