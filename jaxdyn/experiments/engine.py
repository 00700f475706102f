"""The sweep engine under every experiment kind.

    resolve → plan the grid → chunks (each a group of points sharing static fields)
    → for each chunk not on disk: compute, write atomically → merge into one Dataset
    → summary.json, figures.

A killed run loses at most the chunk in flight: ``run_experiment(..., resume=True)`` (the
CLI's ``--resume DIR``) skips every chunk already written, after checking that the
resolved config is the one that wrote them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .. import io as jio
from ..config import ConfigError, Field, config_hash, validate_section, validate_sweep

ENGINE_FIELDS = {
    "kind": Field("str", doc="experiment kind"),
    "name": Field("str", None, "a name for the run"),
    "sweep": Field("any", {}, "grid: {field: [values]}"),
    "chunk_size": Field("int", 0, "points per chunk (0 = automatic from the memory estimate)",
                        check=lambda v: None if v >= 0 else "must be >= 0"),
    "memory_budget_gb": Field("float", 0.0, "memory for one chunk in GiB (0 = a quarter of RAM)",
                              check=lambda v: None if v >= 0 else "must be >= 0"),
}


# Memory the process needs beyond its arrays: XLA compilation, the CPU runtime's buffers
# (which grow with loop iterations when the host cores are several devices), SciPy and
# matplotlib. Calibrated on the 2-core development machine with jax 0.10.2 (concentration_s2:
# 476 MiB peak on 1 device, 646 MiB on 2, for 18.7 MiB of chunk data).
RUNTIME_ALLOWANCE = 320 * 2**20
RUNTIME_ALLOWANCE_PER_DEVICE = 160 * 2**20


@dataclasses.dataclass
class RunResult:
    out_dir: Path
    status: str
    summary: dict
    figures: list
    chunks_computed: int
    chunks_skipped: int
    warnings: list


def resolve_config(raw: dict) -> dict:
    """Validate a raw config (from YAML) into a resolved one, with defaults filled."""
    from . import get_kind

    if not isinstance(raw, dict):
        raise ConfigError("a config must be a mapping")
    if "kind" not in raw:
        raise ConfigError("config field 'kind' is required (e.g. kind: sphere)")
    kind = get_kind(raw["kind"])
    schema = {**ENGINE_FIELDS, **kind.SCHEMA}
    cfg = validate_section("", raw, schema)
    cfg["sweep"] = validate_sweep(cfg.get("sweep") or {}, kind.SCHEMA)
    if cfg["name"] is None:
        cfg["name"] = cfg["kind"]
    return cfg


def grid_points(cfg) -> tuple[list[str], list[dict]]:
    axes = list(cfg["sweep"])
    values = [cfg["sweep"][a] for a in axes]
    pts = [dict(zip(axes, combo)) for combo in itertools.product(*values)]
    return axes, pts


def point_config(cfg, point) -> dict:
    pc = {k: v for k, v in cfg.items() if k != "sweep"}
    pc.update(point)
    return pc


def _memory_budget(cfg) -> int:
    if cfg.get("memory_budget_gb"):
        return int(cfg["memory_budget_gb"] * 2**30)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        total = 8 * 2**30
    return total // 4


def plan_chunks(cfg, kind, points, n_devices: int = 1):
    """Group points by their non-batch fields, then split groups into chunks."""
    batch = set(getattr(kind, "BATCH_AXES", ()))
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        key = json.dumps({k: v for k, v in p.items() if k not in batch}, sort_keys=True)
        groups.setdefault(key, []).append(i)
    budget = _memory_budget(cfg)
    chunks, est = [], {}
    for idxs in groups.values():
        pc = point_config(cfg, points[idxs[0]])
        per_point = int(kind.estimate_bytes(pc))
        if cfg["chunk_size"]:
            size = cfg["chunk_size"]
        else:
            size = max(1, budget // max(per_point, 1))
            if size >= n_devices:
                size -= size % n_devices
        size = max(1, min(size, len(idxs)))
        for s in range(0, len(idxs), size):
            chunks.append(idxs[s:s + size])
            est[len(chunks) - 1] = per_point * len(chunks[-1])
    return chunks, est


def _max_rss() -> int:
    """Peak resident memory of this process so far, in bytes (Linux: ru_maxrss in KiB)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except Exception:  # pragma: no cover
        return 0


def _versions():
    import jax

    out = {"python": platform.python_version(), "jax": jax.__version__,
           "backend": jax.default_backend(), "devices": len(jax.devices())}
    try:
        from importlib.metadata import version
        out["jaxdyn"] = version("jaxdyn")
    except Exception:  # pragma: no cover
        pass
    return out


def _progress(total, initial, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="chunk", desc="jaxdyn", dynamic_ncols=True,
                leave=True)


def run_experiment(raw_or_cfg: dict, out_dir, *, resume: bool = False, progress: bool = True,
                   log=print, compute_hook=None) -> RunResult:
    """Run (or resume) an experiment into ``out_dir``.

    Writes ``config.yaml`` (resolved), ``chunks/`` (one atomic file per finished chunk),
    ``data.nc`` (the merged Dataset, written last), ``summary.json`` (``status`` is
    ``running`` until the end, then ``ok``, ``nonfinite`` or ``failed``) and PNG figures.
    """
    from . import get_kind

    cfg = resolve_config(raw_or_cfg)
    kind = get_kind(cfg["kind"])
    warns = list(kind.check(cfg) or [])
    for w in warns:
        log(f"warning: {w}")
    out = Path(out_dir)
    h = config_hash(cfg)
    cfg_file = out / jio.CONFIG_FILE
    if resume:
        if not cfg_file.exists():
            raise ConfigError(f"--resume {out}: no {jio.CONFIG_FILE} there; nothing to resume")
        old = yaml.safe_load(cfg_file.read_text())
        if config_hash(resolve_config(old)) != h:
            raise ConfigError(f"--resume {out}: the config differs from the one that wrote these "
                              "results; use another --out, or resume without a CONFIG")
    elif (out / jio.CHUNK_DIR).exists() and any((out / jio.CHUNK_DIR).glob("chunk_*.npz")):
        raise ConfigError(f"{out} already holds results; resume them with --resume {out} or choose "
                          "another --out")
    import jax

    # With several processes (jax.distributed), all compute and process 0 writes; the
    # output folder must be on a filesystem they share.
    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        jio.atomic_write_text(cfg_file, yaml.safe_dump(cfg, sort_keys=False))

    n_dev = len(jax.devices())
    axes, points = grid_points(cfg)
    if not points:
        points = [{}]
    chunks, est = plan_chunks(cfg, kind, points, n_dev)
    peak_est = max(est.values())
    # Whole-process estimate: what runs now (JAX runtime, imports) + the largest chunk
    # (device buffers plus their host copies) + the merged results at the end.
    base_rss = _max_rss()
    out_bytes = sum(int(getattr(kind, "output_bytes", lambda pc: 0)(point_config(cfg, p)))
                    for p in points)
    allowance = RUNTIME_ALLOWANCE + RUNTIME_ALLOWANCE_PER_DEVICE * (n_dev - 1)
    process_est = base_rss + allowance + 2 * peak_est + 3 * out_bytes
    log(f"jaxdyn: {cfg['kind']} '{cfg['name']}': {len(points)} grid point(s) in {len(chunks)} "
        f"chunk(s) on {n_dev} {jax.default_backend()} device(s); estimated memory: "
        f"≤ {peak_est / 2**20:.1f} MiB per chunk, ≤ {process_est / 2**20:.0f} MiB for the process")
    t_start = time.time()
    base = {"status": "running", "kind": cfg["kind"], "name": cfg["name"], "config_hash": h,
            "n_points": len(points), "n_chunks": len(chunks), "estimated_chunk_bytes": peak_est,
            "estimated_process_bytes": process_est, "runtime_allowance_bytes": allowance,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": _versions()}
    if writer:
        jio.write_json(out / jio.SUMMARY_FILE, base)

    done = [i for i in range(len(chunks)) if jio.chunk_path(out, i).exists()]
    bar = _progress(len(chunks), len(done), progress)
    computed = 0
    try:
        for ci, idxs in enumerate(chunks):
            path = jio.chunk_path(out, ci)
            if path.exists():
                _, meta = jio.read_chunk(path)
                if meta.get("config_hash") != h or meta.get("points") != idxs:
                    raise ConfigError(f"{path} was written by another config or plan; "
                                      "use a fresh --out")
                continue
            pcs = [point_config(cfg, points[i]) for i in idxs]
            t0 = time.time()
            vars_, coords = kind.run_points(pcs)
            arrays, dims = {}, {}
            for name, (d, a) in vars_.items():
                a = np.asarray(a)
                if a.shape[0] != len(idxs):
                    raise RuntimeError(f"kind {cfg['kind']}: var {name} has {a.shape[0]} rows for "
                                       f"{len(idxs)} points")
                arrays[name] = a
                dims[name] = list(d)
            for name, c in coords.items():
                arrays[f"coord__{name}"] = np.asarray(c)
            if writer:
                jio.write_chunk(path, arrays, {"config_hash": h, "points": idxs, "dims": dims,
                                               "seconds": time.time() - t0})
            computed += 1
            if compute_hook is not None:
                compute_hook(ci)
            if bar is not None:
                bar.update(1)
                elapsed = time.time() - t_start
                bar.set_postfix_str(f"{computed} computed, {len(done)} resumed, "
                                    f"{elapsed:.0f}s")
    except BaseException as e:
        status = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "failed"
        if writer:
            jio.write_json(out / jio.SUMMARY_FILE, {**base, "status": status,
                                                    "chunks_done": len(done) + computed,
                                                    "error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        if bar is not None:
            bar.close()

    if not writer:
        return RunResult(out, "ok", base, [], computed, len(done), warns)
    ds = merge_chunks(cfg, out, axes, points, chunks)
    jio.write_dataset(ds, out / jio.DATA_FILE)
    finite = np.asarray(ds["finite"].values) if "finite" in ds else np.array(True)
    bad = int(np.size(finite) - np.count_nonzero(finite))
    status = "ok" if bad == 0 else "nonfinite"
    summary = dict(base)
    summary.update({"status": status, "elapsed_seconds": time.time() - t_start,
                    "chunks_computed": computed, "chunks_resumed": len(done),
                    "measured_peak_rss_bytes": _max_rss(), "warnings": warns})
    if bad:
        bad_pts = [points[i] for i in np.flatnonzero(~finite.reshape(-1))][:20] if axes else [{}]
        summary["nonfinite_points"] = bad_pts
        summary["message"] = (f"non-finite states at {bad} of {len(points)} grid point(s), "
                              f"e.g. {bad_pts[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary["results"] = kind.summarize(cfg, ds)
    figures = [str(p) for p in kind.plot(cfg, ds, out)]
    summary["figures"] = [Path(f).name for f in figures]
    summary["data_file"] = jio.DATA_FILE
    jio.write_json(out / jio.SUMMARY_FILE, summary)
    return RunResult(out, status, summary, figures, computed, len(done), warns)


def merge_chunks(cfg, out, axes, points, chunks):
    """Merge chunk files into one Dataset with the sweep axes as named dimensions."""
    import xarray as xr

    shape = tuple(len(cfg["sweep"][a]) for a in axes)
    flat_index = {json.dumps(p, sort_keys=True): i for i, p in enumerate(points)}
    data: dict[str, Any] = {}
    dims: dict[str, list] = {}
    coord_vals: dict[str, list] = {}
    for ci, idxs in enumerate(chunks):
        arrays, meta = jio.read_chunk(jio.chunk_path(out, ci))
        for name, d in meta["dims"].items():
            dims.setdefault(name, d)
            data.setdefault(name, {})
            for row, pi in enumerate(idxs):
                data[name][pi] = arrays[name][row]
        for k, v in arrays.items():
            if k.startswith("coord__"):
                coord_vals.setdefault(k[7:], []).append(v)
    coords: dict[str, Any] = {a: cfg["sweep"][a] for a in axes}
    varying = set()
    for dim, vals in coord_vals.items():
        first = vals[0]
        if all(v.shape == first.shape and np.allclose(v, first, equal_nan=True) for v in vals):
            coords[dim] = first
        else:
            varying.add(dim)  # e.g. saved times differ across a swept t1: keep as index
    ds = xr.Dataset(coords={k: np.asarray(v) for k, v in coords.items()})
    for name, rows in data.items():
        arrs = [rows[i] for i in range(len(points))]
        tshape = tuple(max(a.shape[j] for a in arrs) for j in range(arrs[0].ndim))
        dtype = arrs[0].dtype
        if dtype.kind == "b":
            full = np.zeros((len(points),) + tshape, bool)
        else:
            full = np.full((len(points),) + tshape, np.nan, np.result_type(dtype, np.float32))
        for i, a in enumerate(arrs):
            full[(i,) + tuple(slice(0, s) for s in a.shape)] = a
        # A variable may not share its name with a dimension (e.g. a metric called "scale"
        # in a sweep over "scale"): it is stored as NAME_value.
        vname = f"{name}_value" if name in coords or name in axes or name in dims[name] else name
        ds[vname] = (tuple(axes) + tuple(dims[name]), full.reshape(shape + tshape))
    if varying:
        # Per-point coordinate values, stored as data (padded with NaN).
        for dim in varying:
            ds.attrs[f"{dim}_varies"] = ("this coordinate differs between grid points; it is kept "
                                         "as an index (kinds store per-point values as data)")
    ds.attrs["kind"] = cfg["kind"]
    ds.attrs["name"] = cfg["name"]
    ds.attrs["config_yaml"] = yaml.safe_dump(cfg, sort_keys=False)
    return ds


def report(run_dir, log=print, movie=False) -> list:
    """Redraw every figure of a finished run from its saved results (no recomputation);
    ``movie=True`` also writes the kind's particle animation (kinds with a ``movie``)."""
    from . import get_kind

    run_dir = Path(run_dir)
    cfg_file = run_dir / jio.CONFIG_FILE
    if not cfg_file.exists():
        raise ConfigError(f"{run_dir} holds no {jio.CONFIG_FILE}: not a jaxdyn run folder")
    cfg = resolve_config(yaml.safe_load(cfg_file.read_text()))
    ds = jio.open_results(run_dir)
    figs = [str(p) for p in get_kind(cfg["kind"]).plot(cfg, ds, run_dir)]
    if movie:
        if not hasattr(get_kind(cfg["kind"]), "movie"):
            raise ConfigError(f"kind {cfg['kind']!r} has no particle movie")
        figs.append(str(get_kind(cfg["kind"]).movie(cfg, ds, run_dir)))
    return figs
