"""Running the chunks: the machine's limits, and the loop that computes and writes chunks.

The writer stores each chunk atomically as it finishes, so a killed run loses at most the chunk
in flight. The loop checks for a signal between chunks, moves the progress bar within a chunk
(:mod:`.progress`) and counts the time spent computing apart from compiling.

With several processes the kind says how they share the work (``process_split``):

* ``"devices"``: every process runs every chunk, whose points ``run_points`` shards over the
  devices of all of them (one program across the cluster);
* ``"points"``: ``run_points`` runs on this process's devices alone; the chunks still to
  compute (or, when there are fewer chunks than processes, parts of each chunk's points) are
  dealt out in rounds, one item per process, and after each round every process's outputs are
  gathered to the writer, which stores the chunks completed. A process that stops is noticed
  by the others at the round's gather.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .. import io as jio
from . import folder
from . import progress as jprogress
from .kinds import ExperimentKind
from .planning import MemoryEstimate, Plan, point_config
from .processes import Processes


def check_interrupt():
    """Raise ``KeyboardInterrupt`` if the CLI's handler saw a signal whose exception was lost.

    Python ignores exceptions raised in garbage-collection callbacks (such as XLA's) during
    the merge or the figures; the handler also records the signal in ``io.PENDING_SIGNALS``.

    Raises:
      KeyboardInterrupt: a SIGINT/SIGTERM is pending.
    """
    if jio.PENDING_SIGNALS:
        raise KeyboardInterrupt(f"signal {jio.PENDING_SIGNALS[-1]}")


def max_rss() -> int:
    """Peak resident memory of this process so far, in bytes (Linux: ru_maxrss in KiB)."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except Exception:  # pragma: no cover
        return 0


def current_rss() -> int:
    """Resident memory of this process now, in bytes (0 where unknown)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover
        return 0


def host_memory_total() -> int:
    """The host's memory in bytes (8 GiB where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 * 2**30


def host_memory_available() -> tuple[int, str]:
    """Bytes this process may still use on the host, and where that bound comes from.

    Returns:
      ``(bytes, where)``: MemAvailable plus what the process holds already, or ``ulimit -v``
      if lower.
    """
    avail, where = None, "available on this host"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024 + current_rss()
                break
    except OSError:  # pragma: no cover - not Linux
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") + current_rss()
        except (ValueError, OSError, AttributeError):  # pragma: no cover
            avail = None
    try:
        import resource

        lim = resource.getrlimit(resource.RLIMIT_AS)[0]
        if lim != resource.RLIM_INFINITY and (avail is None or lim < avail):
            avail, where = lim, "allowed by `ulimit -v`"
    except (ImportError, ValueError, OSError):  # pragma: no cover
        pass
    return (avail if avail is not None else 2**62), where


def device_memory_limit() -> Optional[int]:
    """Bytes on one accelerator (None on CPU or when the backend does not say)."""
    import jax

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return None
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # pragma: no cover - backend without memory_stats
        return None
    return stats.get("bytes_limit")


@dataclasses.dataclass
class Run:
    """Everything the chunk loop and the report of one run need.

    Attributes:
      cfg: the resolved config.
      kind: the experiment kind.
      out: the run folder.
      config_hash: the resolved config's hash.
      plan: the grid and its chunks.
      memory: the memory estimate.
      processes: this process's part.
      log: where to print (silent on processes other than the writer).
      warnings: the run's warnings so far (appended to).
    """

    cfg: dict
    kind: ExperimentKind
    out: Path
    config_hash: str
    plan: Plan
    memory: MemoryEstimate
    processes: Processes
    log: Callable
    warnings: list


@dataclasses.dataclass
class Tally:
    """What the chunk loop did.

    Attributes:
      done: indices of the chunks found on disk (skipped).
      computed: chunks computed by this process.
      compute_seconds: the chunks' seconds less the compilation inside them.
    """

    done: list = dataclasses.field(default_factory=list)
    computed: int = 0
    compute_seconds: float = 0.0


def finished_chunks(run: Run) -> list:
    """The chunks already on disk for this config and plan, agreed by every process.

    Args:
      run: the run.

    Returns:
      Their indices.
    """
    def find():
        return folder.existing_chunks(run.out, run.plan.chunks, run.config_hash, run.log, run.warnings)

    return run.processes.shared_done(find, len(run.plan.chunks))


def progress_bar(total: int, initial: int, enabled: bool):
    """A tqdm bar in chunks that moves within a chunk too (fractions from :mod:`.progress`).

    Args:
      total: the chunk count.
      initial: chunks already done.
      enabled: False for no bar.

    Returns:
      The bar, or None.
    """
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="chunk", desc="jaxdyn", dynamic_ncols=True,
                leave=True, bar_format="{l_bar}{bar}| {n:.2f}/{total} chunks "
                "[{elapsed}<{remaining}{postfix}]")


def _bar_sink(bar, base):
    """Moves ``bar`` to ``base`` + the fraction of the chunk in flight (at most every 0.2 s)."""
    if bar is None:
        return lambda frac: None
    last = [0.0]

    def sink(frac):
        now = time.time()
        if now - last[0] >= 0.2 or frac >= 1.0:
            last[0] = now
            bar.n = base + frac
            bar.refresh()

    return sink


def _bar_note(bar):
    """Shows a kind's note (:func:`.progress.note`) after ``bar`` (at most every 0.2 s)."""
    if bar is None:
        return None
    last = [0.0]

    def note(text):
        now = time.time()
        if now - last[0] >= 0.2:
            last[0] = now
            bar.set_postfix_str(text)

    return note


def _compile_seconds() -> float:
    from .. import compile_stats

    return compile_stats()["compile_seconds"]


def compute_chunk(run: Run, ci: int, bar=None, position: int = 0) -> float:
    """Compute chunk ``ci`` and (on the writer) write its file.

    Args:
      run: the run.
      ci: the chunk's index.
      bar: the progress bar (or None).
      position: chunks finished before this one (where the bar starts).

    Returns:
      The chunk's seconds less the compilation inside them.
    """
    idxs = run.plan.chunks[ci]
    pcs = [point_config(run.cfg, run.plan.points[i]) for i in idxs]
    t0 = time.time()
    c0 = _compile_seconds()
    with jprogress.within_chunk(_bar_sink(bar, position), _bar_note(bar)):
        outputs = run.kind.run_points(pcs)
    arrays, dims = folder.chunk_record(run.cfg["kind"], len(idxs), outputs)
    if run.processes.writer:
        jio.write_chunk(jio.chunk_path(run.out, ci), arrays,
                        {"config_hash": run.config_hash, "points": idxs, "dims": dims,
                         "seconds": time.time() - t0})
    return (time.time() - t0) - (_compile_seconds() - c0)


def process_split(run: Run) -> str:
    """How the processes share the run's work: ``"devices"`` or ``"points"`` (module doc).

    Args:
      run: the run.

    Returns:
      The kind's answer for the run's config.

    Raises:
      RuntimeError: an answer that is neither (a bug of the kind).
    """
    split = run.kind.process_split(run.cfg)
    if split not in ("devices", "points"):
        raise RuntimeError(f"kind {run.cfg['kind']}: process_split gave {split!r}")
    return split


def work_items(run: Run, todo: list, n_proc: int) -> list:
    """The items a ``"points"`` run deals out: ``(chunk, positions of its points)``, in order.

    Whole chunks when there are at least as many as processes; else each chunk's points cut into
    contiguous parts, so that every process gets an item where the points allow.

    Args:
      run: the run.
      todo: the chunks to compute.
      n_proc: the process count.

    Returns:
      The items.
    """
    parts = 1 if len(todo) >= n_proc else -(-n_proc // max(len(todo), 1))
    items = []
    for ci in todo:
        n = len(run.plan.chunks[ci])
        k = max(1, min(parts, n))
        bounds = [round(j * n / k) for j in range(k + 1)]
        items += [(ci, list(range(a, b))) for a, b in zip(bounds[:-1], bounds[1:])]
    return items


def pack_record(arrays: dict, dims: dict) -> bytes:
    """A chunk record (:func:`.folder.chunk_record`) as bytes (NumPy's npz of plain arrays)."""
    buf = io.BytesIO()
    np.savez(buf, **{f"a__{k}": np.asarray(v) for k, v in arrays.items()},
             dims=np.frombuffer(json.dumps(dims).encode(), np.uint8))
    return buf.getvalue()


def unpack_record(data: bytes) -> tuple[dict, dict]:
    """The ``(arrays, dims)`` of :func:`pack_record`'s bytes."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        dims = json.loads(bytes(z["dims"]).decode())
        return {k[3:]: z[k] for k in z.files if k.startswith("a__")}, dims


def join_parts(parts: list) -> tuple[dict, dict]:
    """One chunk's record from the records of its parts, in order (rows of vars stacked)."""
    arrays0, dims = parts[0]
    arrays = {k: (v if k.startswith("coord__") else np.concatenate([p[0][k] for p in parts]))
              for k, v in arrays0.items()}
    return arrays, dims


def run_chunks_by_points(run: Run, tally: Tally, bar=None, compute_hook: Optional[Callable] = None):
    """:func:`run_chunks` for a ``"points"`` kind with several processes (module doc).

    Args:
      run: the run.
      tally: the finished chunks on entry; on return ``computed`` counts the chunks written
        (writer) or the items computed (others).
      bar: the progress bar (or None).
      compute_hook: called with a chunk's index once this process has computed its item of it.
    """
    procs = run.processes
    todo = [ci for ci in range(len(run.plan.chunks)) if ci not in tally.done]
    items = work_items(run, todo, procs.count)
    pending: dict = {}
    t_start = time.time()
    for r0 in range(0, len(items), procs.count):
        procs.stop_if_preempted()  # the collective first: a held signal stops every process
        check_interrupt()
        mine = items[r0 + procs.index] if r0 + procs.index < len(items) else None
        data = b""
        if mine is not None:
            ci, pos = mine
            idxs = [run.plan.chunks[ci][p] for p in pos]
            pcs = [point_config(run.cfg, run.plan.points[i]) for i in idxs]
            t0, c0 = time.time(), _compile_seconds()
            with jprogress.within_chunk(_bar_sink(bar, len(tally.done) + tally.computed),
                                        _bar_note(bar)):
                outputs = run.kind.run_points(pcs)
            data = pack_record(*folder.chunk_record(run.cfg["kind"], len(idxs), outputs))
            tally.compute_seconds += (time.time() - t0) - (_compile_seconds() - c0)
            if not procs.writer:
                tally.computed += 1
        got = procs.gather_bytes(data)
        if mine is not None and compute_hook is not None:
            compute_hook(mine[0])
        if not procs.writer:
            continue
        for j, blob in enumerate(got):
            if r0 + j >= len(items):
                break
            ci, pos = items[r0 + j]
            pending.setdefault(ci, []).append(unpack_record(blob))
            n_parts = sum(1 for it in items if it[0] == ci)
            if len(pending[ci]) == n_parts:
                arrays, dims = join_parts(pending.pop(ci))
                jio.write_chunk(jio.chunk_path(run.out, ci), arrays,
                                {"config_hash": run.config_hash, "points": run.plan.chunks[ci],
                                 "dims": dims, "seconds": time.time() - t_start})
                tally.computed += 1
        _show_progress(bar, tally, t_start)
    procs.stop_if_preempted()
    check_interrupt()


def _show_progress(bar, tally: Tally, t_start: float):
    """Move the progress bar (if any) to the chunks finished so far, with their counts."""
    if bar is not None:
        bar.n = len(tally.done) + tally.computed
        bar.refresh()
        bar.set_postfix_str(f"{tally.computed} computed, {len(tally.done)} resumed, "
                            f"{time.time() - t_start:.0f}s")


def run_chunks(run: Run, tally: Tally, bar=None, compute_hook: Optional[Callable] = None):
    """Compute every chunk not in ``tally.done``, in order; the writer stores each.

    With several processes and a kind whose points split over them (``process_split``
    ``"points"``): :func:`run_chunks_by_points`.

    Args:
      run: the run.
      tally: the finished chunks (``done``) on entry; counts of this loop on return.
      bar: the progress bar (or None).
      compute_hook: called with a chunk's index once it is computed (and written).
    """
    if run.processes.multi and process_split(run) == "points":
        run_chunks_by_points(run, tally, bar, compute_hook)
        return
    t_start = time.time()
    for ci in range(len(run.plan.chunks)):
        if ci in tally.done:
            continue
        run.processes.stop_if_preempted()  # the collective first: a held signal stops all
        check_interrupt()
        tally.compute_seconds += compute_chunk(run, ci, bar, len(tally.done) + tally.computed)
        tally.computed += 1
        if compute_hook is not None:
            compute_hook(ci)
        _show_progress(bar, tally, t_start)
    run.processes.stop_if_preempted()
    check_interrupt()
