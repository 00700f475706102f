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
from . import progress as jprogress
from ..config import ConfigError, Field, config_hash, parse_yaml, validate_section, validate_sweep

ENGINE_FIELDS = {
    "kind": Field("str", doc="experiment kind"),
    "name": Field("str", None, "a name for the run (a plain file name: it names the default "
                  "folder runs/NAME-TIMESTAMP)", check=lambda v: _plain_name(v)),
    "sweep": Field("any", {}, "grid: {field: [values]}"),
    "chunk_size": Field("int", 0, "points per chunk (0 = automatic from the memory estimate)",
                        check=lambda v: None if v >= 0 else "must be >= 0"),
    "memory_budget_gb": Field("float", 0.0, "memory for one chunk in GiB (0 = a quarter of RAM)",
                              check=lambda v: None if v >= 0 else "must be >= 0"),
}


def _plain_name(v: str):
    if not v or v in (".", "..") or v.startswith(".") or any(c in v for c in "/\\\0") \
            or len(v) > 200:
        return ("must be a plain file name (no '/', no leading '.', at most 200 characters): "
                "it names the folder runs/NAME-TIMESTAMP")
    return None


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
    writer: bool = True  # False on the processes other than 0 of a jax.distributed run


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


def _memory_budget(cfg, n_devices: int = 1) -> int:
    """Bytes for one chunk: ``memory_budget_gb``, else a quarter of RAM, and at most half of
    the accelerators' memory (one chunk is sharded over ``n_devices``)."""
    if cfg.get("memory_budget_gb"):
        return int(cfg["memory_budget_gb"] * 2**30)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        total = 8 * 2**30
    budget = total // 4
    dev = _device_memory_limit()
    if dev is not None:
        budget = min(budget, n_devices * dev // 2)
    return budget


def plan_chunks(cfg, kind, points, n_devices: int = 1):
    """Group points by their non-batch fields, then split groups into chunks."""
    batch = set(getattr(kind, "BATCH_AXES", ()))
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        key = json.dumps({k: v for k, v in p.items() if k not in batch}, sort_keys=True)
        groups.setdefault(key, []).append(i)
    budget = _memory_budget(cfg, n_devices)
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
    """A bar in chunks that moves within a chunk too (fractions reported by the kind's loops
    through :mod:`.progress`), with tqdm's elapsed time and ETA."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="chunk", desc="jaxdyn", dynamic_ncols=True,
                leave=True, bar_format="{l_bar}{bar}| {n:.2f}/{total} chunks "
                "[{elapsed}<{remaining}{postfix}]")


def _compile_seconds() -> float:
    return _compile_stats()["compile_seconds"]


def _compile_stats() -> dict:
    from .. import compile_stats

    return compile_stats()


class RunLockedError(ConfigError):
    """Another process holds the run folder's lock (the message names it)."""


class ProcessLostError(ConnectionError):
    """Another process of a ``jax.distributed`` run stopped mid-run; this one stops too
    (finished chunks are kept: ``--resume`` with any number of processes)."""


class RunLock:
    """An exclusive lock on a run folder (``flock`` on ``DIR/.jaxdyn.lock``): one run at a
    time writes into a folder. The kernel drops the lock when its process ends, however it
    ends (SIGKILL included), so a stale lock never blocks a resume. The file records the
    holder (pid, host, start time) for the refusal's message."""

    def __init__(self, out: Path):
        self.path = Path(out) / jio.LOCK_FILE
        self.fd = None

    def acquire(self):
        import fcntl
        import socket

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, jio.file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "a process that is starting"
            os.close(fd)
            raise RunLockedError(f"{self.path.parent} is in use by another jaxdyn run ({holder}); "
                                 "wait for it to end, or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')}".encode())
        self.fd = fd
        return self

    def release(self):
        if self.fd is not None:
            import fcntl

            try:
                os.ftruncate(self.fd, 0)
            except OSError:  # pragma: no cover - e.g. the folder's file system went away
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def check_interrupt():
    """Raise ``KeyboardInterrupt`` if the CLI's signal handler saw SIGINT/SIGTERM whose own
    exception was swallowed (Python ignores exceptions raised in garbage-collection
    callbacks, such as XLA's, during the merge or the figures)."""
    if jio.PENDING_SIGNALS:
        raise KeyboardInterrupt(f"signal {jio.PENDING_SIGNALS[-1]}")


def _host_memory_available() -> tuple[int, str]:
    """Bytes this process may still use on the host, and where that bound comes from:
    MemAvailable (plus what the process holds already), or ``ulimit -v`` if lower."""
    avail, where = None, "available on this host"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024 + _current_rss()
                break
    except OSError:  # pragma: no cover - not Linux
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") + _current_rss()
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


def _current_rss() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover
        return 0


def _device_memory_limit():
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


def check_memory(cfg, per_point: int, peak_chunk: int, process: int, n_devices: int = 1):
    """Refuse (``ConfigError``) before any allocation a run whose memory estimate exceeds
    what the host (or one device) has, naming the field that drives it and the estimate."""
    avail, where = _host_memory_available()
    dev_limit = _device_memory_limit()
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    # n drives it when one grid point alone is too big (a smaller sweep cannot help then)
    if "n" in cfg and (2 * per_point > 0.5 * process or 2 * per_point > avail):
        field = f"config field 'n' (= {cfg['n']})"
    elif cfg.get("sweep"):
        field = f"config field 'sweep' ({', '.join(f'{k}: {len(v)} values' for k, v in cfg['sweep'].items())})"
    else:
        field = "this config"
    if process > avail:
        raise ConfigError(f"{field}: the run needs an estimated {mib(process)} of memory "
                          f"({mib(per_point)} per grid point), more than the {mib(avail)} {where}; "
                          "make it smaller")
    per_device = max(per_point, -(-peak_chunk // max(n_devices, 1)))
    if dev_limit is not None and per_device > dev_limit:
        raise ConfigError(f"{field}: a chunk needs an estimated {mib(per_device)} on each device, "
                          f"more than its {mib(dev_limit)}; make it smaller (or set chunk_size)")


def _prepare_folder(out: Path, h: str, *, resume: bool, force: bool):
    """Under the lock: refuse a folder that is not this config's run (module doc)."""
    cfg_file = out / jio.CONFIG_FILE
    old_hash = None
    if cfg_file.exists():
        old = parse_yaml(_read_text(cfg_file), f"{cfg_file}")
        try:
            old_hash = config_hash(resolve_config(old))
        except ConfigError as e:
            if resume:
                raise ConfigError(f"--resume {out}: its {jio.CONFIG_FILE} is not a valid config: "
                                  f"{e}") from None
    if resume:
        if not cfg_file.exists():
            raise ConfigError(f"--resume {out}: no {jio.CONFIG_FILE} there; nothing to resume")
        if old_hash != h:
            raise ConfigError(f"--resume {out}: the config differs from the one that wrote these "
                              "results; use another --out, or resume without a CONFIG")
        return
    entries = sorted(p.name for p in out.iterdir()
                     if p.name != jio.LOCK_FILE and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    if not entries:
        return
    chunk_dir = out / jio.CHUNK_DIR
    has_chunks = chunk_dir.is_dir() and any(chunk_dir.glob("chunk_*.npz"))
    if force:
        if has_chunks:
            for p in chunk_dir.glob("chunk_*.npz"):
                p.unlink()
        if (out / jio.DATA_FILE).exists():
            (out / jio.DATA_FILE).unlink()
        # the old run's figures, as its summary lists them (left beside the new data they
        # contradicted it; other files stay)
        try:
            old_figs = json.loads((out / jio.SUMMARY_FILE).read_text()).get("figures") or []
        except (OSError, ValueError, AttributeError):
            old_figs = []
        for name in old_figs:
            if isinstance(name, str) and Path(name).name == name and (out / name).is_file():
                (out / name).unlink()
        return
    hint = "choose another --out, or add --force to overwrite it"
    if has_chunks and old_hash is not None and old_hash != h:
        raise ConfigError(f"{out} already holds results of another config; {hint}")
    if has_chunks:
        raise ConfigError(f"{out} already holds results; resume them with --resume {out}, or "
                          f"{hint}")
    if old_hash == h and (out / jio.DATA_FILE).exists():
        raise ConfigError(f"{out} already holds a finished run of this config ({jio.DATA_FILE}); "
                          f"rebuild it with --resume {out}, or {hint}")
    if old_hash == h and set(entries) <= {jio.CONFIG_FILE, jio.SUMMARY_FILE, jio.CHUNK_DIR}:
        return  # a run of this config stopped before its first chunk: start again
    listed = ", ".join(entries[:5]) + (", …" if len(entries) > 5 else "")
    what = ("a run of another config" if old_hash is not None and old_hash != h
            else "not a run of this config")
    raise ConfigError(f"--out {out} is not empty and is {what} (it holds {listed}); {hint}")


def _remove_stale_temporaries(out: Path):
    """Temporary files of an earlier process killed mid-write (``.NAME.XXXX.tmp``, see
    :mod:`jaxdyn.io`); safe under the lock: no other writer is in this folder."""
    for d in (out, out / jio.CHUNK_DIR):
        if d.is_dir():
            for p in d.glob(".*.tmp"):
                if p.is_file():
                    p.unlink()


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _check_out(out: Path):
    """An output path that cannot be a folder is a :class:`ConfigError` naming it."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create the folder ({e.strerror or e})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: the folder is not writable")


def _adopt_plan(out, chunks, est, h):
    """On ``--resume``: the chunks on disk may follow a plan made for another device count or
    memory budget (the automatic chunk size depends on both): keep each finished chunk, at
    its index, and give the points no finished chunk holds to the other slots, in the current
    plan's groups. (Before, such a resume was refused and the finished work thrown away.)
    Returns ``(chunks, est)`` unchanged when the plans agree or nothing can be adopted."""
    folder = Path(out) / jio.CHUNK_DIR
    found = {}
    for path in sorted(folder.glob("chunk_*.npz")) if folder.is_dir() else []:
        try:
            _, meta = jio.read_chunk(path, meta_only=True)
            ci = int(path.stem.split("_")[1])
        except (jio.DamagedFileError, ValueError, IndexError):
            continue  # _existing_chunks names a damaged file
        if meta.get("config_hash") != h:
            return chunks, est  # another config: _existing_chunks refuses it
        found[ci] = [int(i) for i in meta.get("points", [])]
    if all(ci < len(chunks) and chunks[ci] == pts for ci, pts in found.items()):
        return chunks, est
    covered = [i for pts in found.values() for i in pts]
    if len(covered) != len(set(covered)):
        return chunks, est
    per_point = {i: est[ci] // max(len(c), 1) for ci, c in enumerate(chunks) for i in c}
    rest = [[i for i in c if i not in set(covered)] for c in chunks]
    rest = iter([c for c in rest if c])
    slots = [found.get(ci) for ci in range(max(found) + 1)]
    slots = [c if c is not None else next(rest, None) for c in slots]
    if any(c is None for c in slots):
        return chunks, est  # a gap no remaining point fills: _existing_chunks refuses
    new = slots + list(rest)
    return new, {ci: sum(per_point[i] for i in c) for ci, c in enumerate(new)}


def _existing_chunks(out, chunks, h, log, warns):
    """Indices of chunks already on disk for this config; a damaged chunk file is named,
    removed and recomputed; a chunk of another config or plan is a refusal."""
    done = []
    for ci, idxs in enumerate(chunks):
        path = jio.chunk_path(out, ci)
        if not path.exists():
            continue
        try:
            _, meta = jio.read_chunk(path, meta_only=True)
        except jio.DamagedFileError as e:
            msg = f"{e}; it is recomputed"
            log(f"warning: {msg}")
            warns.append(msg)
            path.unlink()
            continue
        if meta.get("config_hash") != h or meta.get("points") != idxs:
            raise ConfigError(f"{path} was written by another config or plan; use a fresh --out")
        done.append(ci)
    return done


def run_experiment(raw_or_cfg: dict, out_dir, *, resume: bool = False, progress: bool = True,
                   log=print, compute_hook=None, force: bool = False) -> RunResult:
    """Run (or resume) an experiment into ``out_dir``.

    Writes ``config.yaml`` (resolved), ``chunks/`` (one atomic file per finished chunk),
    ``data.nc`` (the merged Dataset, written last), ``summary.json`` (``status`` is
    ``running`` until the end, then ``ok``, ``nonfinite``, ``interrupted`` or ``failed``) and
    PNG figures.

    Refused before any compute (:class:`ConfigError`, naming the problem): a memory estimate
    above what the host or the device has; an ``out_dir`` that is a file or cannot be made;
    a folder another run holds (:class:`RunLockedError`, naming the holder); without
    ``resume``, a non-empty folder that is not a fresh run of this config (``force=True``
    overwrites its results); with ``resume``, a folder of another config. A damaged chunk
    file is named in a warning and recomputed; the merge re-checks that every chunk was
    written by this config.
    """
    from . import get_kind

    compile0 = _compile_stats()
    cfg = resolve_config(raw_or_cfg)
    kind = get_kind(cfg["kind"])
    multi, writer = _process_role()
    if not writer:  # one line, then silence: process 0 reports
        import jax

        log(f"jaxdyn: process {jax.process_index()} of {jax.process_count()} on "
            f"{platform.node()} ({jax.local_device_count()} {jax.default_backend()} device(s)): "
            f"computing its share of every chunk of '{cfg['name']}'; process 0 writes {out_dir}")
        log, progress = (lambda *_: None), False
    warns = list(kind.check(cfg) or [])
    for w in warns:
        log(f"warning: {w}")
    out = Path(out_dir)
    h = config_hash(cfg)
    failure = None  # with several processes, a refusal on any of them is shared (below)
    try:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} exists and is not a folder")
        if resume and not (out / jio.CONFIG_FILE).is_file():
            raise ConfigError(f"--resume {out}: no {jio.CONFIG_FILE} there; nothing to resume")
    except ConfigError as e:
        if not multi:
            raise
        failure = e
    import jax

    # With several processes (jax.distributed), all compute and process 0 writes; the
    # output folder must be on a filesystem they share.
    n_dev = len(jax.devices())
    axes, points = grid_points(cfg)
    if not points:
        points = [{}]
    chunks, est = plan_chunks(cfg, kind, points, n_dev)
    if resume:
        chunks, est = _adopt_plan(out, chunks, est, config_hash(cfg))
    peak_est = max(est.values())
    per_point = max(est[i] // max(len(c), 1) for i, c in enumerate(chunks))
    # Whole-process estimate: what runs now (JAX runtime, imports) + the largest chunk
    # (device buffers plus their host copies) + the merged results at the end.
    base_rss = _max_rss()
    out_bytes = sum(int(getattr(kind, "output_bytes", lambda pc: 0)(point_config(cfg, p)))
                    for p in points)
    allowance = RUNTIME_ALLOWANCE + RUNTIME_ALLOWANCE_PER_DEVICE * (jax.local_device_count() - 1)
    process_est = base_rss + allowance + 2 * peak_est + 3 * out_bytes
    cfg_file = out / jio.CONFIG_FILE
    lock = None
    try:
        # With several processes a refusal on any of them is shared (every process stops),
        # and they agree on the config before process 0 touches the folder.
        try:
            if failure is None:
                check_memory(cfg, per_point, peak_est, process_est, n_dev)
        except ConfigError as e:
            if not multi:
                raise
            failure = e
        if multi:
            _agree_on_run(h, resume, len(chunks), failure)
        try:
            if writer:
                _check_out(out)
                lock = RunLock(out).acquire()
                _prepare_folder(out, h, resume=resume, force=force)
                _remove_stale_temporaries(out)
                jio.atomic_write_text(cfg_file, yaml.safe_dump(cfg, sort_keys=False))
        except ConfigError as e:
            if not multi:
                raise
            failure = e
        if multi:
            _share_refusal(failure)
        return _run_locked(cfg, kind, out, h, axes, points, chunks, warns, n_dev, writer,
                           peak_est, process_est, allowance, progress, log, compute_hook, compile0,
                           multi)
    finally:
        if lock is not None:
            lock.release()


def _run_locked(cfg, kind, out, h, axes, points, chunks, warns, n_dev, writer, peak_est,
                process_est, allowance, progress, log, compute_hook, compile0=None,
                multi=False):
    import jax

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

    bar = None
    computed = 0
    compute_s = 0.0  # chunk seconds less the compilation inside them
    done: list = []
    try:
        if multi:
            done = _shared_done(out, chunks, h, log, warns, writer)
        else:
            done = _existing_chunks(out, chunks, h, log, warns)
        bar = _progress(len(chunks), len(done), progress)
        for ci, idxs in enumerate(chunks):
            check_interrupt()
            path = jio.chunk_path(out, ci)
            if ci in done:
                continue
            if multi:
                _stop_if_preempted()
            pcs = [point_config(cfg, points[i]) for i in idxs]
            t0 = time.time()
            c0 = _compile_seconds()
            with jprogress.within_chunk(_bar_sink(bar, ci, len(done) + computed)):
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
            compute_s += (time.time() - t0) - (_compile_seconds() - c0)
            if compute_hook is not None:
                compute_hook(ci)
            if bar is not None:
                bar.n = len(done) + computed
                bar.refresh()
                elapsed = time.time() - t_start
                bar.set_postfix_str(f"{computed} computed, {len(done)} resumed, "
                                    f"{elapsed:.0f}s")
        check_interrupt()
        if bar is not None:
            bar.close()
            bar = None
        if not writer:
            return RunResult(out, "ok", base, [], computed, len(done), warns, writer=False)
        ds = merge_chunks(cfg, out, axes, points, chunks, config_hash=h)
        check_interrupt()
        jio.write_dataset(ds, out / jio.DATA_FILE)
        check_interrupt()
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
        check_interrupt()
        t_fig = time.time()
        figures = [str(p) for p in kind.plot(cfg, ds, out)]
        check_interrupt()
        summary["figures_seconds"] = time.time() - t_fig
        c1 = _compile_stats()
        c0 = compile0 or dict.fromkeys(c1, 0)
        # compile_seconds: tracing, lowering and XLA compilation (or loading from the
        # persistent cache) over the whole run; compute_seconds: the chunks' time without it.
        summary["compile_seconds"] = c1["compile_seconds"] - c0["compile_seconds"]
        summary["compute_seconds"] = compute_s
        summary["compile_seconds_parts"] = {
            part: c1[f"{part}_seconds"] - c0[f"{part}_seconds"] for part in ("trace", "lower", "backend")}
        summary["compiled_programs"] = c1["compiles"] - c0["compiles"]
        summary["compile_cache_hits"] = c1["cache_hits"] - c0["cache_hits"]
        summary["elapsed_seconds"] = time.time() - t_start
        summary["compilation_cache"] = jax.config.jax_compilation_cache_dir
        summary["figures"] = [Path(f).name for f in figures]
        summary["data_file"] = jio.DATA_FILE
        jio.write_json(out / jio.SUMMARY_FILE, summary)
    except BaseException as e:
        status = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "failed"
        lost = _lost_process(e) if multi else None
        if lost is not None:
            e = lost
        elif multi:  # this process stops on its own: leave now, so that the others stop too
            from ..simulation import abandon_cluster

            abandon_cluster(_exit_status(e))
        if writer:
            try:
                jio.write_json(out / jio.SUMMARY_FILE, {
                    **base, "status": status, "chunks_done": len(done) + computed,
                    "error": f"{type(e).__name__}: {e}"})
            except OSError:  # the disk is full: the summary keeps its last state
                pass
        if lost is not None:
            raise lost from None
        raise
    finally:
        if bar is not None:
            bar.close()
    return RunResult(out, status, summary, figures, computed, len(done), warns)


def _bar_sink(bar, ci, base):
    """Moves ``bar`` to ``base`` + the fraction of chunk ``ci`` done (at most every 0.2 s)."""
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


def _process_role() -> tuple[bool, bool]:
    """(several processes?, is this process the writer?) — without starting JAX when this
    process has not joined a ``jax.distributed`` cluster."""
    import jax

    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return False, True
    return True, jax.process_index() == 0


def _hash_row(h: str) -> list:
    return [int(h[i:i + 4], 16) for i in range(0, 16, 4)]  # 16 hex digits in int32s


def _gather(row):
    """``all_gather_rows(row)``; a process lost meanwhile is a :class:`ProcessLostError`."""
    from ..simulation import all_gather_rows

    try:
        return all_gather_rows(row)
    except Exception as e:
        lost = _lost_process(e)
        if lost is None:
            raise
        raise lost from None


def _agree_on_run(h, resume, n_chunks, failure):
    """Several processes: all of them start the run, or all refuse it. Every process shares
    its refusal (memory; on process 0 the folder checks) and its config hash, resume flag and
    chunk count; a difference from process 0 is a refusal on every process, naming it."""
    rows = _gather([failure is not None, bool(resume), n_chunks] + _hash_row(h))
    _raise_refusals(rows[:, 0], failure)
    for i in range(1, rows.shape[0]):
        if rows[i, 1] != rows[0, 1]:
            raise ConfigError(f"process {i} was started {'with' if rows[i, 1] else 'without'} "
                              f"--resume and process 0 {'with' if rows[0, 1] else 'without'}; "
                              "every process must be started with the same arguments")
        if list(rows[i, 2:]) != list(rows[0, 2:]):
            which = "this process" if i == _process_index() else f"process {i}"
            raise ConfigError(f"{which}'s config differs from process 0's (config hash "
                              f"{''.join(f'{v:04x}' for v in rows[i, 3:])} vs "
                              f"{''.join(f'{v:04x}' for v in rows[0, 3:])}, {rows[i, 2]} vs "
                              f"{rows[0, 2]} chunks): every process must run the same config "
                              "(same file, --set and dtype)")


def _lost_process(e):
    """A :class:`ProcessLostError` if ``e`` says another process went away, else None; the
    cluster is then marked abandoned (this process exits without JAX's shutdown barrier)."""
    import jax

    from ..simulation import abandon_cluster, is_lost_process_error

    if isinstance(e, ProcessLostError):
        return e
    if isinstance(e, (KeyboardInterrupt, SystemExit)) or not is_lost_process_error(e):
        return None
    abandon_cluster()
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return ProcessLostError(f"process {jax.process_index()} of {jax.process_count()}: another "
                            f"process of this run stopped ({first}); this one stops too")


def _share_refusal(failure):
    """Several processes: raise ``failure`` here, or a refusal naming the process that
    refused, if any process refused."""
    _raise_refusals(_gather([failure is not None])[:, 0], failure)


def _raise_refusals(flags, failure):
    """This process's ``failure`` if any, else a refusal naming the first process whose flag
    is set (its own message says why)."""
    if failure is not None:
        raise failure
    bad = np.flatnonzero(flags)
    if bad.size:
        raise ConfigError(f"process {int(bad[0])} refused the run (its message says why); every "
                          "process stops")


_SYNC_STEPS = itertools.count()  # chunk boundaries, counted alike by every process


def _stop_if_preempted():
    """Several processes: SIGTERM to any of them (a preemption notice; JAX's preemption
    service catches it) stops all of them at the same chunk boundary, as an interrupt."""
    import signal

    from jax.experimental import multihost_utils

    try:
        stop = multihost_utils.reached_preemption_sync_point(next(_SYNC_STEPS))
    except RuntimeError:  # the preemption service is off: signals reach the CLI's handler
        return
    if stop:
        jio.PENDING_SIGNALS.append(int(signal.SIGTERM))
        raise KeyboardInterrupt(f"signal {int(signal.SIGTERM)} (a preemption notice: every "
                                "process stops at this chunk)")


def _exit_status(e) -> int:
    """The CLI's exit status for ``e`` (README, "What `jaxdyn run` writes")."""
    if isinstance(e, ConfigError):
        return 4 if isinstance(e, RunLockedError) else 2
    if isinstance(e, KeyboardInterrupt):
        return 128 + int(jio.PENDING_SIGNALS[-1] if jio.PENDING_SIGNALS else 2)
    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else 1
    return 1


def _process_index():
    import jax

    return jax.process_index()


def _shared_done(out, chunks, h, log, warns, writer):
    """Several processes: the chunks on disk, as process 0 finds them (it alone reads and
    cleans the folder), so that every process skips the same ones."""
    done, err = [], None
    if writer:
        try:
            done = _existing_chunks(out, chunks, h, log, warns)
        except ConfigError as e:
            err = e
    mask = np.zeros(len(chunks) + 1, np.int32)
    mask[0] = err is not None
    mask[[1 + ci for ci in done]] = 1
    rows = _gather(mask)
    _raise_refusals(rows[:1, 0], err)
    return [int(ci) for ci in np.flatnonzero(rows[0, 1:])]


def merge_chunks(cfg, out, axes, points, chunks, config_hash=None):
    """Merge chunk files into one Dataset with the sweep axes as named dimensions. With
    ``config_hash``, every chunk must carry it and its planned points (``ConfigError``
    naming the chunk otherwise: it was written by another run into the same folder)."""
    import xarray as xr

    shape = tuple(len(cfg["sweep"][a]) for a in axes)
    flat_index = {json.dumps(p, sort_keys=True): i for i, p in enumerate(points)}
    data: dict[str, Any] = {}
    dims: dict[str, list] = {}
    coord_vals: dict[str, list] = {}
    for ci, idxs in enumerate(chunks):
        path = jio.chunk_path(out, ci)
        try:
            arrays, meta = jio.read_chunk(path)
        except jio.DamagedFileError as e:
            raise ConfigError(f"{e}; delete it and run `jaxdyn run --resume {out}` to recompute "
                              "it") from None
        if config_hash is not None and (meta.get("config_hash") != config_hash
                                        or meta.get("points") != idxs):
            raise ConfigError(f"{path} was written by another config or plan "
                              f"(config hash {meta.get('config_hash')}, this run's {config_hash}); "
                              "its data are not merged: use a fresh --out")
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
        # (the sphere kinds refuse sweeps that change the saved times: t1, dt)
        for dim in varying:
            ds.attrs[f"{dim}_varies"] = ("this coordinate differs between grid points; it is kept "
                                         "as an index 0, 1, ..., and its values are not stored")
    ds.attrs["kind"] = cfg["kind"]
    ds.attrs["name"] = cfg["name"]
    ds.attrs["config_yaml"] = yaml.safe_dump(cfg, sort_keys=False)
    return ds


def report(run_dir, log=print, movie=False) -> list:
    """Redraw every figure of a finished run from its saved results (no recomputation);
    ``movie=True`` also writes the kind's particle animation (kinds with a ``movie``)."""
    from . import get_kind

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"report {run_dir}: no such folder")
    cfg_file = run_dir / jio.CONFIG_FILE
    if not cfg_file.exists():
        raise ConfigError(f"{run_dir} holds no {jio.CONFIG_FILE}: not a jaxdyn run folder")
    cfg = resolve_config(parse_yaml(_read_text(cfg_file), str(cfg_file)))
    try:
        ds = jio.open_results(run_dir)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    except jio.DamagedFileError as e:
        raise ConfigError(str(e)) from None
    figs = [str(p) for p in get_kind(cfg["kind"]).plot(cfg, ds, run_dir)]
    if movie:
        if not hasattr(get_kind(cfg["kind"]), "movie"):
            raise ConfigError(f"kind {cfg['kind']!r} has no particle movie")
        figs.append(str(get_kind(cfg["kind"]).movie(cfg, ds, run_dir)))
    return figs
