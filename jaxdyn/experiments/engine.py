"""The sweep engine under every experiment kind: the pipeline of its parts.

    resolve and plan (:mod:`.planning`: grid, chunks, memory) → the run folder (:mod:`.folder`:
    lock, resume, merge) → the chunks (:mod:`.runner` on this machine, :mod:`.processes` across
    a ``jax.distributed`` cluster) → the report (:mod:`.reporting`: ``data.nc``,
    ``summary.json``, figures).

A killed run loses at most the chunk in flight: ``run_experiment(..., resume=True)`` (the CLI's
``--resume DIR``) skips every chunk already written, after checking that the resolved config is
the one that wrote them.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Optional

from .. import io as jio
from ..config import config_hash
from . import folder, reporting, runner
from .folder import RunLock, merge_chunks
from .kinds import get_kind
from .planning import (ENGINE_FIELDS, RUNTIME_ALLOWANCE, RUNTIME_ALLOWANCE_PER_DEVICE,
                       MemoryEstimate, Plan, estimate_memory, grid_points, memory_budget,
                       point_config, refuse_oversized, resolve_config, split_chunks)
from .processes import Processes, ProcessLostError, RunLockedError
from .reporting import report
from .runner import check_interrupt, device_memory_limit, host_memory_available


@dataclasses.dataclass
class RunResult:
    """What :func:`run_experiment` returns.

    Attributes:
      out_dir: the run folder.
      status: ``ok`` or ``nonfinite``.
      summary: the summary written to ``summary.json`` (the base summary on a process that
        does not write).
      figures: the figure paths.
      chunks_computed: chunks this process computed.
      chunks_skipped: chunks found on disk.
      warnings: the run's warnings.
      writer: False on the processes other than 0 of a ``jax.distributed`` run.
    """

    out_dir: Path
    status: str
    summary: dict
    figures: list
    chunks_computed: int
    chunks_skipped: int
    warnings: list
    writer: bool = True


def plan_chunks(cfg: dict, kind, points: list, n_devices: int = 1):
    """Group points by their non-batch fields, then split groups into chunks that fit memory.

    Args:
      cfg: a resolved config.
      kind: the experiment kind.
      points: the grid points.
      n_devices: devices one chunk is sharded over.

    Returns:
      ``(chunks, est)``: lists of point indices, and each chunk's estimated bytes.
    """
    budget = memory_budget(cfg, n_devices, runner.host_memory_total(), device_memory_limit())
    return split_chunks(cfg, kind, points, n_devices, budget)


def check_memory(cfg: dict, per_point: int, peak_chunk: int, process: int, n_devices: int = 1,
                 kind=None):
    """Refuse, before any allocation, a run whose estimate exceeds what the machine has.

    Args:
      cfg: a resolved config (the refusal names the field that drives the estimate).
      per_point: bytes of one grid point.
      peak_chunk: bytes of the largest chunk.
      process: bytes of the whole process.
      n_devices: devices a chunk is sharded over.
      kind: the experiment kind (to name the field that drives one point's estimate).
    """
    refuse_oversized(cfg, MemoryEstimate(per_point, peak_chunk, process, n_devices=n_devices),
                     host_memory_available(), device_memory_limit(), kind)


def _plan(cfg, kind, out: Path, resume: bool) -> tuple[Plan, MemoryEstimate]:
    """The run's plan (finished chunks of another plan adopted on resume) and its memory."""
    import jax

    n_dev = len(jax.devices())
    axes, points = grid_points(cfg)
    if not points:
        points = [{}]
    chunks, est = plan_chunks(cfg, kind, points, n_dev)
    if resume:
        chunks, est = folder.adopt_plan(out, chunks, est, config_hash(cfg))
    plan = Plan(axes, points, chunks, est)
    return plan, estimate_memory(cfg, kind, plan, (n_dev, jax.local_device_count()), runner.max_rss())


def run_experiment(raw_or_cfg: dict, out_dir, *, resume: bool = False, progress: bool = True,
                   log: Callable = print, compute_hook: Optional[Callable] = None,
                   force: bool = False) -> RunResult:
    """Run (or resume) an experiment into ``out_dir``.

    Writes ``config.yaml`` (resolved), ``chunks/`` (one atomic file per finished chunk),
    ``data.nc`` (the merged Dataset, written last), ``summary.json`` (``status`` is ``running``
    until the end, then ``ok``, ``nonfinite``, ``interrupted`` or ``failed``) and PNG figures.
    With several processes (``jax.distributed``) all compute and process 0 writes; the folder
    must be on a file system they share.

    Args:
      raw_or_cfg: the config (raw from YAML, or resolved).
      out_dir: the run folder.
      resume: resume the run in ``out_dir`` (its finished chunks are kept).
      progress: show a progress bar.
      log: where to print (the plan, warnings).
      compute_hook: called with a chunk's index once it is computed.
      force: run into a non-empty folder that is not a run of this config, replacing its results.

    Returns:
      The :class:`RunResult`.

    Refused before any compute (``ConfigError``, naming the problem): a bad config; a memory
    estimate above what the host or the device has; an ``out_dir`` that is a file or cannot be
    made; a folder another run holds (:class:`RunLockedError`, naming the holder); without
    ``resume``, a non-empty folder that is not a fresh run of this config (``force`` overwrites
    its results); with ``resume``, a folder of another config. A damaged chunk file is named in a
    warning and recomputed; the merge re-checks that every chunk was written by this config.
    """
    clock = (time.time(), reporting.compile_stats())
    cfg = resolve_config(raw_or_cfg)
    kind = get_kind(cfg["kind"])
    procs = Processes.current()
    if not procs.writer:  # one line, then silence: process 0 reports
        log(f"jaxdyn: {procs.describe()}: computing its share of the chunks of '{cfg['name']}'; "
            f"process 0 writes {out_dir}")
        log, progress = (lambda *_: None), False
    warns = list(kind.check(cfg) or [])
    for w in warns:
        log(f"warning: {w}")
    out = Path(out_dir)
    with procs.refusals():
        folder.check_path(out, resume)
    plan, memory = _plan(cfg, kind, out, resume)
    lock = None
    try:
        # With several processes a refusal on any of them is shared (every process stops), and
        # they agree on the config before process 0 touches the folder.
        if procs.failure is None:
            with procs.refusals():
                check_memory(cfg, memory.per_point, memory.peak_chunk, memory.process, memory.n_devices,
                             kind)
        procs.agree_on_run(config_hash(cfg), resume, len(plan.chunks))
        with procs.refusals():
            if procs.writer:
                lock = folder.open_folder(out, cfg, resume=resume, force=force)
        procs.share_refusal()
        run = runner.Run(cfg, kind, out, config_hash(cfg), plan, memory, procs, log, warns)
        return _run_locked(run, progress, compute_hook, clock)
    finally:
        if lock is not None:
            lock.release()


def _preload_figures(kind: str) -> None:
    """Import the kind's figure module (matplotlib with it) in a background thread.

    The chunks run in XLA with Python's lock released, so the import (about half a second)
    overlaps the compute instead of following it. An import error is left for the report to
    raise (where it is named) when the figures are drawn.
    """
    import importlib
    import threading

    from .kinds import KINDS

    def load():
        try:
            importlib.import_module(f"{KINDS[kind]}.figures")
        except Exception:  # noqa: BLE001 - raised again, and named, when the figures are drawn
            pass

    threading.Thread(target=load, name="jaxdyn-preload-figures", daemon=True).start()


def _run_locked(run: runner.Run, progress: bool, compute_hook, clock) -> RunResult:
    """The chunks and the report, with the folder locked (on the writer)."""
    import jax

    mem = run.memory
    run.log(f"jaxdyn: {run.cfg['kind']} '{run.cfg['name']}': {len(run.plan.points)} grid point(s) in "
            f"{len(run.plan.chunks)} chunk(s) on {mem.n_devices} {jax.default_backend()} device(s); "
            f"estimated memory: ≤ {mem.peak_chunk / 2**20:.1f} MiB per chunk, "
            f"≤ {mem.process / 2**20:.0f} MiB for the process")
    clock = (time.time(), clock[1])
    base = reporting.base_summary(run)
    writer = run.processes.writer
    tally = runner.Tally()
    bar = None
    try:  # from the first summary on: a signal anywhere leaves summary.json interrupted
        if writer:
            jio.write_json(run.out / jio.SUMMARY_FILE, base)
            _preload_figures(run.cfg["kind"])
        tally.done = runner.finished_chunks(run)
        bar = runner.progress_bar(len(run.plan.chunks), len(tally.done), progress)
        runner.run_chunks(run, tally, bar, compute_hook)
        if bar is not None:
            bar.close()
            bar = None
        if not writer:
            return RunResult(run.out, "ok", base, [], tally.computed, len(tally.done), run.warnings,
                             writer=False)
        summary, figures = reporting.finish(run, tally, base, clock)
    except BaseException as e:
        stop = run.processes.stopping(e)
        if writer:
            reporting.failed(run, base, tally, stop)
        if stop is not e:
            raise stop from None
        raise
    finally:
        if bar is not None:
            bar.close()
    return RunResult(run.out, summary["status"], summary, figures, tally.computed, len(tally.done),
                     run.warnings)


__all__ = ["ENGINE_FIELDS", "RUNTIME_ALLOWANCE", "RUNTIME_ALLOWANCE_PER_DEVICE", "Plan",
           "MemoryEstimate", "ProcessLostError", "RunLock", "RunLockedError", "RunResult",
           "check_interrupt", "check_memory", "grid_points", "merge_chunks", "plan_chunks",
           "point_config", "report", "resolve_config", "run_experiment"]
