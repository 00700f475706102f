"""Reporting a run: ``summary.json``, the merged ``data.nc``, the figures; ``jaxdyn report``.

``jaxdyn report`` redraws the figures of a finished run from its ``data.nc``.

``summary.json`` says ``running`` from the first chunk on, then ``ok``, ``nonfinite`` (some grid
points hold non-finite states: named), ``some_unsuccessful`` or ``all_unsuccessful`` (a kind whose
grid points end with a result code, ``jaxdyn.RESULTS``: some or all of them not ``successful``;
``point_results`` counts the points by result name), ``interrupted`` or ``failed`` (with the error).
``compile_seconds`` is the tracing, lowering and XLA compilation (or loading from JAX's
persistent cache) of the whole run, ``compute_seconds`` the chunks' time without it.
"""

from __future__ import annotations

import platform
import time
import warnings
from pathlib import Path

import numpy as np

from .. import io as jio
from ..config import ConfigError, config_hash, parse_yaml
from .folder import RunLock, merge_chunks, read_text
from .kinds import get_kind
from .planning import resolve_config
from .processes import RunLockedError
from .runner import Run, Tally, check_interrupt, max_rss


def compile_stats() -> dict:
    """JAX's compilation counters so far (:func:`jaxdyn.compile_stats`).

    Returns:
      The counters.
    """
    from .. import compile_stats as stats

    return stats()


def versions() -> dict:
    """Python, JAX, the backend, the device and process counts and jaxdyn's version.

    Returns:
      The versions.
    """
    import jax

    out = {"python": platform.python_version(), "jax": jax.__version__,
           "backend": jax.default_backend(), "devices": len(jax.devices()),
           "processes": jax.process_count()}
    try:
        from importlib.metadata import version
        out["jaxdyn"] = version("jaxdyn")
    except Exception:  # pragma: no cover
        pass
    return out


def base_summary(run: Run) -> dict:
    """The summary's fields known before the first chunk (``status: running``).

    Args:
      run: the run.

    Returns:
      The summary.
    """
    return {"status": "running", "kind": run.cfg["kind"], "name": run.cfg["name"],
            "config_hash": run.config_hash, "n_points": len(run.plan.points),
            "n_chunks": len(run.plan.chunks), "estimated_chunk_bytes": run.memory.peak_chunk,
            "estimated_process_bytes": run.memory.process,
            "runtime_allowance_bytes": run.memory.allowance,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": versions()}


def compile_summary(before: dict, after: dict) -> dict:
    """The compilation fields of the summary between two :func:`compile_stats`.

    Args:
      before: the counters at the run's start.
      after: the counters at its end.

    Returns:
      ``compile_seconds``, ``compile_seconds_parts`` (trace, lower, backend),
      ``compiled_programs`` and ``compile_cache_hits``.
    """
    return {
        "compile_seconds": after["compile_seconds"] - before["compile_seconds"],
        "compile_seconds_parts": {part: after[f"{part}_seconds"] - before[f"{part}_seconds"]
                                  for part in ("trace", "lower", "backend")},
        "compiled_programs": after["compiles"] - before["compiles"],
        "compile_cache_hits": after["cache_hits"] - before["cache_hits"],
    }


def _nonfinite(run: Run, ds) -> dict:
    """``status`` and, where grid points hold non-finite states, which and a message."""
    finite = np.asarray(ds["finite"].values) if "finite" in ds else np.array(True)
    bad = int(np.size(finite) - np.count_nonzero(finite))
    if not bad:
        return {"status": "ok"}
    points = run.plan.points
    bad_pts = [points[i] for i in np.flatnonzero(~finite.reshape(-1))][:20] if run.plan.axes else [{}]
    return {"status": "nonfinite", "nonfinite_points": bad_pts,
            "message": (f"non-finite states at {bad} of {len(points)} grid point(s), "
                        f"e.g. {bad_pts[0]}")}


def point_results(ds, axes) -> dict:
    """The run's status from its grid points' result codes, and their count by result name.

    A kind whose points end with a result code (a ``status`` variable over the sweep axes alone,
    one code a grid point: the index in ``jaxdyn.STATUS_NAMES``) is ``ok`` only when every point
    is ``successful``. Codes of another shape (one per member of a point) are not the points'.

    Args:
      ds: the merged Dataset.
      axes: the sweep's axes.

    Returns:
      ``{}`` without such codes; else ``point_results`` (result name → number of points) and
      ``status``: ``ok`` (every point successful), ``some_unsuccessful`` or
      ``all_unsuccessful``, with a ``message`` naming the counts when not ``ok``.
    """
    from .. import STATUS_NAMES

    if "status" not in ds or not set(ds["status"].dims) <= set(axes):
        return {}
    codes = np.asarray(ds["status"].values).reshape(-1)
    if codes.size == 0 or not (np.issubdtype(codes.dtype, np.integer)
                               or np.issubdtype(codes.dtype, np.floating)):
        return {}
    if np.issubdtype(codes.dtype, np.floating):
        # a results file stores the codes as floats (NaN-able): whole numbers only
        if not np.all(np.isfinite(codes) & (codes == np.round(codes))):
            return {}
        codes = codes.astype(np.int64)
    counts: dict = {}
    for c in codes.tolist():
        name = STATUS_NAMES[c] if 0 <= c < len(STATUS_NAMES) else f"code {c}"
        counts[name] = counts.get(name, 0) + 1
    counts = dict(sorted(counts.items(), key=lambda kv: (kv[0] != "successful", kv[0])))
    good = counts.get("successful", 0)
    out = {"point_results": counts}
    if good == codes.size:
        return {**out, "status": "ok"}
    bad = ", ".join(f"{n} at {k}" for n, k in counts.items() if n != "successful")
    return {**out, "status": "all_unsuccessful" if good == 0 else "some_unsuccessful",
            "message": f"{codes.size - good} of {codes.size} grid point(s) not successful ({bad})"}


def _tolerant(run: Run, summary: dict, what: str, make, empty):
    """``make()``; in a run with non-finite points an error there is a warning and ``empty``.

    The results of a run that ends ``nonfinite`` (exit 3) are what they are: a summary or a
    figure that cannot be made from its NaN or inf values is named, not a crash of the run.
    An error in a run without non-finite points is raised (a bug).

    Returns:
      What ``make()`` returns, or ``empty``.
    """
    try:
        return make()
    except Exception as e:
        if summary.get("status") != "nonfinite":
            raise
        msg = (f"the {what} of a run with non-finite points are incomplete "
               f"({type(e).__name__}: {' '.join(str(e).split())[:200]})")
        run.warnings.append(msg)
        run.log(f"warning: {msg}")
        return empty


def finish(run: Run, tally: Tally, base: dict, clock: tuple[float, dict]) -> tuple[dict, list]:
    """Merge the chunks into ``data.nc``, summarise, draw the figures, write ``summary.json``.

    Args:
      run: the run (on the writer).
      tally: what the chunk loop did.
      base: the summary so far (:func:`base_summary`).
      clock: ``(time.time(), compile_stats())`` at the run's start.

    Returns:
      ``(summary, figure paths)``.
    """
    import jax

    t_start, compile0 = clock
    plan = run.plan
    ds = merge_chunks(run.cfg, run.out, plan.axes, plan.points, plan.chunks, config_hash=run.config_hash)
    check_interrupt()
    jio.write_dataset(ds, run.out / jio.DATA_FILE)
    check_interrupt()
    summary = dict(base)
    summary.update({"status": "ok", "elapsed_seconds": time.time() - t_start,
                    "chunks_computed": tally.computed, "chunks_resumed": len(tally.done),
                    "measured_peak_rss_bytes": max_rss(), "warnings": run.warnings})
    summary.update(_nonfinite(run, ds))
    points = point_results(ds, plan.axes)
    if points:  # non-finite states take precedence over the result codes (exit code 3)
        summary["point_results"] = points["point_results"]
        if summary["status"] == "ok":
            summary.update({k: v for k, v in points.items() if k != "point_results"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary["results"] = _tolerant(run, summary, "summary", lambda: run.kind.summarize(run.cfg, ds), {})
    check_interrupt()
    t_fig = time.time()
    figures = [str(p) for p in _tolerant(run, summary, "figures",
                                         lambda: run.kind.plot(run.cfg, ds, run.out), [])]
    check_interrupt()
    summary["figures_seconds"] = time.time() - t_fig
    after = compile_stats()
    # compile_seconds: tracing, lowering and XLA compilation (or loading from the persistent
    # cache) over the whole run; compute_seconds: the chunks' time without it.
    summary.update(compile_summary(compile0 or dict.fromkeys(after, 0), after))
    summary["compute_seconds"] = tally.compute_seconds
    summary["elapsed_seconds"] = time.time() - t_start
    # every thread of this process (the writer's, on several processes), imports included
    summary["process_cpu_seconds"] = time.process_time()
    summary["compilation_cache"] = jax.config.jax_compilation_cache_dir
    summary["figures"] = [Path(f).name for f in figures]
    summary["data_file"] = jio.DATA_FILE
    jio.write_json(run.out / jio.SUMMARY_FILE, summary)
    return summary, figures


def failed(run: Run, base: dict, tally: Tally, error: BaseException):
    """Record a run that stops (``interrupted`` or ``failed``) in ``summary.json``.

    A full disk keeps the summary's last state.

    Args:
      run: the run (on the writer).
      base: the summary so far.
      tally: what the chunk loop did.
      error: why it stops.
    """
    status = "interrupted" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "failed"
    try:
        jio.write_json(run.out / jio.SUMMARY_FILE, {
            **base, "status": status, "chunks_done": len(tally.done) + tally.computed,
            "error": f"{type(error).__name__}: {error}"})
    except OSError:  # the disk is full: the summary keeps its last state
        pass


def _report_lock(run_dir: Path):
    """The run folder's lock for the redraw, None where this user cannot create the lock file."""
    try:
        return RunLock(run_dir).acquire()
    except RunLockedError as e:
        raise RunLockedError(f"report {run_dir}: a run is still writing this folder "
                             f"({e.holder or 'another process'}); redraw its figures once "
                             "it has ended") from None
    except OSError:  # a folder this user may not write: the figures' write names the problem
        return None


def _check_same_run(run_dir: Path, cfg: dict, ds):
    """Refuse a ``data.nc`` written by another config than the folder's ``config.yaml``."""
    text = ds.attrs.get("config_yaml")
    if not isinstance(text, str):
        return
    try:
        theirs = config_hash(resolve_config(parse_yaml(text, f"{run_dir / jio.DATA_FILE}'s config")))
    except ConfigError:
        theirs = None
    if theirs != config_hash(cfg):
        raise ConfigError(f"{run_dir / jio.DATA_FILE} was written by another config than "
                          f"{run_dir / jio.CONFIG_FILE} (config hash {theirs}, the folder's "
                          f"{config_hash(cfg)}); rebuild it with `jaxdyn run --resume {run_dir}`")


def report(run_dir, log=print, movie: bool = False) -> list:
    """Redraw every figure of a finished run from its saved results (no recomputation).

    The folder is locked while the figures are drawn (a live run's folder is refused), and its
    ``data.nc`` must come from its ``config.yaml``.

    Args:
      run_dir: the run folder.
      log: unused (kept for callers that pass one).
      movie: also write the kind's particle animation (kinds with a ``movie``).

    Returns:
      The paths of the figures written.

    Raises:
      ConfigError: no such folder, not a run folder, no finished results, results of another
        config, or no movie for the kind (named).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"report {run_dir}: no such folder")
    cfg_file = run_dir / jio.CONFIG_FILE
    if not cfg_file.exists():
        raise ConfigError(f"{run_dir} holds no {jio.CONFIG_FILE}: not a jaxdyn run folder")
    lock = _report_lock(run_dir)
    try:
        cfg = resolve_config(parse_yaml(read_text(cfg_file), str(cfg_file)))
        kind = get_kind(cfg["kind"])
        if movie and not hasattr(kind, "movie"):
            raise ConfigError(f"kind {cfg['kind']!r} has no particle movie")
        try:
            ds = jio.open_results(run_dir)
        except (FileNotFoundError, jio.DamagedFileError) as e:
            raise ConfigError(str(e)) from None
        _check_same_run(run_dir, cfg, ds)
        figs = [str(p) for p in kind.plot(cfg, ds, run_dir)]
        if movie:
            figs.append(str(kind.movie(cfg, ds, run_dir)))
        return figs
    finally:
        if lock is not None:
            lock.release()
