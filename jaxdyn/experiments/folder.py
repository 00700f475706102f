"""The run folder: its lock, what may be resumed or overwritten, the chunk files and their merge.

A folder holds one run: ``config.yaml`` (resolved), ``chunks/`` (one atomic file per finished
chunk, carrying the config's hash and its points), ``data.nc`` (the merged Dataset),
``summary.json`` and the figures. One run at a time writes into it (:class:`RunLock`). Without
``--resume`` a folder holding another config's results (or results at all) is refused unless
``--force``; with ``--resume`` the config must be the one that wrote it, and the finished chunks
are kept — also when the plan differs (another device count or memory budget:
:func:`adopt_plan`). A damaged chunk is named and recomputed; the merge re-checks every chunk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .. import io as jio
from ..config import ConfigError, config_hash, parse_yaml
from .planning import resolve_config
from .processes import RunLockedError


class RunLock:
    """An exclusive lock on a run folder (``flock`` on ``DIR/.jaxdyn.lock``).

    One run at a time writes into a folder. The kernel drops the lock when its process ends,
    however it ends (SIGKILL included), so a stale lock never blocks a resume. The file records
    the holder (pid, host, start time) for the refusal's message.

    Args:
      out: the run folder.
    """

    def __init__(self, out: Path):
        self.path = Path(out) / jio.LOCK_FILE
        self.fd = None

    def acquire(self) -> RunLock:
        """Take the lock.

        Returns:
          This lock.

        Raises:
          RunLockedError: another process holds it (the message names the holder).
        """
        import fcntl
        import socket

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, jio.file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "a process that is starting"
            os.close(fd)
            raise RunLockedError(f"{self.path.parent} is in use by another jaxdyn run ({holder}); "
                                 "wait for it to end, or choose another --out", holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')}".encode())
        self.fd = fd
        return self

    def release(self):
        """Release the lock (a no-op when not held)."""
        if self.fd is not None:
            import fcntl

            try:
                os.ftruncate(self.fd, 0)
            except OSError:  # pragma: no cover - e.g. the folder's file system went away
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def read_text(path: Path) -> str:
    """A file's text.

    Args:
      path: the file.

    Returns:
      Its UTF-8 text.

    Raises:
      ConfigError: the file is not UTF-8 (named).
    """
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def check_path(out: Path, resume: bool):
    """Refuse, before planning, an ``--out`` that is a file or a ``--resume`` of nothing.

    Args:
      out: the run folder.
      resume: whether the run resumes.

    Raises:
      ConfigError: naming the problem.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    if resume and not (out / jio.CONFIG_FILE).is_file():
        raise ConfigError(f"--resume {out}: no {jio.CONFIG_FILE} there; nothing to resume")


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


def _remove_old_results(out: Path, chunk_dir: Path):
    """``--force``: the old run's chunks, data file and the figures its summary lists."""
    for p in chunk_dir.glob("chunk_*.npz") if chunk_dir.is_dir() else ():
        p.unlink()
    if (out / jio.DATA_FILE).exists():
        (out / jio.DATA_FILE).unlink()
    # the old run's figures, as its summary lists them (left beside the new data they would
    # contradict it; other files stay)
    try:
        old_figs = json.loads((out / jio.SUMMARY_FILE).read_text()).get("figures") or []
    except (OSError, ValueError, AttributeError):
        old_figs = []
    for name in old_figs:
        if isinstance(name, str) and Path(name).name == name and (out / name).is_file():
            (out / name).unlink()


def _old_hash(out: Path, resume: bool):
    """The hash of the config in the folder (None if none or, without resume, invalid)."""
    cfg_file = out / jio.CONFIG_FILE
    if not cfg_file.exists():
        return None
    old = parse_yaml(read_text(cfg_file), f"{cfg_file}")
    try:
        return config_hash(resolve_config(old))
    except ConfigError as e:
        if resume:
            raise ConfigError(f"--resume {out}: its {jio.CONFIG_FILE} is not a valid config: "
                              f"{e}") from None
        return None


def prepare(out: Path, h: str, *, resume: bool, force: bool):
    """Under the lock: refuse a folder that is not this config's run (module doc).

    Args:
      out: the run folder.
      h: the resolved config's hash.
      resume: whether the run resumes.
      force: overwrite another run's results.

    Raises:
      ConfigError: the folder holds something this run may not resume or overwrite (named).
    """
    chunk_dir = out / jio.CHUNK_DIR
    if chunk_dir.exists() and not chunk_dir.is_dir():
        raise ConfigError(f"{chunk_dir} is not a folder: it blocks the chunk files; move it away "
                          "(a run keeps its chunks there)")
    old_hash = _old_hash(out, resume)
    if resume:
        if not (out / jio.CONFIG_FILE).exists():
            raise ConfigError(f"--resume {out}: no {jio.CONFIG_FILE} there; nothing to resume")
        if old_hash != h:
            raise ConfigError(f"--resume {out}: the config differs from the one that wrote these "
                              "results; use another --out, or resume without a CONFIG")
        return
    entries = sorted(p.name for p in out.iterdir()
                     if p.name != jio.LOCK_FILE and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    if not entries:
        return
    has_chunks = chunk_dir.is_dir() and any(chunk_dir.glob("chunk_*.npz"))
    if force:
        _remove_old_results(out, chunk_dir)
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


def remove_stale_temporaries(out: Path):
    """Remove the temporary files of an earlier process killed mid-write.

    ``.NAME.XXXX.tmp`` (see :mod:`jaxdyn.io`); safe under the lock: no other writer is in this
    folder.

    Args:
      out: the run folder.
    """
    for d in (out, out / jio.CHUNK_DIR):
        if d.is_dir():
            for p in d.glob(".*.tmp"):
                if p.is_file():
                    p.unlink()


def open_folder(out: Path, cfg: dict, *, resume: bool, force: bool) -> RunLock:
    """Make, lock and prepare the run folder, and write its ``config.yaml``.

    Args:
      out: the run folder.
      cfg: the resolved config.
      resume: whether the run resumes.
      force: overwrite another run's results.

    Returns:
      The held lock, for the caller to release (released here when preparing the folder
      fails). A folder that cannot be made or written, is locked or may not be used is a
      ``ConfigError`` naming the problem.
    """
    _check_out(out)
    lock = RunLock(out).acquire()
    try:
        prepare(out, config_hash(cfg), resume=resume, force=force)
        remove_stale_temporaries(out)
        jio.atomic_write_text(out / jio.CONFIG_FILE, yaml.safe_dump(cfg, sort_keys=False))
    except BaseException:
        lock.release()
        raise
    return lock


def adopt_plan(out: Path, chunks: list, est: dict, h: str):
    """On ``--resume``: keep the finished chunks of another plan, at their indices.

    The chunks on disk may follow a plan made for another device count or memory budget (the
    automatic chunk size depends on both): each finished chunk keeps its index, and the points
    no finished chunk holds fill the other slots, in the current plan's groups.

    Args:
      out: the run folder.
      chunks: this plan's chunks.
      est: this plan's chunk estimates.
      h: the resolved config's hash.

    Returns:
      ``(chunks, est)``, unchanged when the plans agree or nothing can be adopted.
    """
    folder = Path(out) / jio.CHUNK_DIR
    found = {}
    for path in sorted(folder.glob("chunk_*.npz")) if folder.is_dir() else []:
        try:
            _, meta = jio.read_chunk(path, meta_only=True)
            ci = int(path.stem.split("_")[1])
        except (jio.DamagedFileError, ValueError, IndexError):
            continue  # existing_chunks names a damaged file
        if meta.get("config_hash") != h:
            return chunks, est  # another config: existing_chunks refuses it
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
        return chunks, est  # a gap no remaining point fills: existing_chunks refuses
    new = slots + list(rest)
    return new, {ci: sum(per_point[i] for i in c) for ci, c in enumerate(new)}


def existing_chunks(out: Path, chunks: list, h: str, log, warns: list) -> list:
    """Indices of the chunks already on disk for this config and plan.

    Each file is read whole (a flipped byte fails its checksum); a damaged chunk file is named
    (``log`` and ``warns``), removed and recomputed.

    Args:
      out: the run folder.
      chunks: the plan's chunks.
      h: the resolved config's hash.
      log: where to print the warning.
      warns: the run's warnings (appended to).

    Returns:
      The finished chunks' indices.

    Raises:
      ConfigError: a chunk of another config or plan.
    """
    done = []
    for ci, idxs in enumerate(chunks):
        path = jio.chunk_path(out, ci)
        if not path.exists():
            continue
        try:
            _, meta = jio.read_chunk(path)  # the arrays too: their checksums find flipped bytes
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


def chunk_record(kind_name: str, n_points: int, outputs: tuple) -> tuple[dict, dict]:
    """The arrays and dims of a chunk file from a kind's ``run_points`` result.

    Args:
      kind_name: the kind (for the error message).
      n_points: the chunk's point count.
      outputs: ``(vars, coords)`` of ``run_points``.

    Returns:
      ``(arrays, dims)``: every var and coordinate (``coord__NAME``) as a NumPy array, and each
      var's dims.

    Raises:
      RuntimeError: a var without one row per point (a bug of the kind).
    """
    vars_, coords = outputs
    arrays, dims = {}, {}
    for name, (d, a) in vars_.items():
        a = np.asarray(a)
        if a.shape[0] != n_points:
            raise RuntimeError(f"kind {kind_name}: var {name} has {a.shape[0]} rows for "
                               f"{n_points} points")
        arrays[name] = a
        dims[name] = list(d)
    for name, c in coords.items():
        arrays[f"coord__{name}"] = np.asarray(c)
    return arrays, dims


def _read_chunks(out, chunks, config_hash):
    """Per var its rows by point index and dims, and each coordinate's values per chunk."""
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
    return data, dims, coord_vals


def _padded(arrs: list) -> np.ndarray:
    """Rows of possibly different shapes in one array, padded with NaN (False for booleans)."""
    tshape = tuple(max(a.shape[j] for a in arrs) for j in range(arrs[0].ndim))
    dtype = arrs[0].dtype
    if dtype.kind == "b":
        full = np.zeros((len(arrs),) + tshape, bool)
    else:
        full = np.full((len(arrs),) + tshape, np.nan, np.result_type(dtype, np.float32))
    for i, a in enumerate(arrs):
        full[(i,) + tuple(slice(0, s) for s in a.shape)] = a
    return full


def merge_chunks(cfg: dict, out, axes: list, points: list, chunks: list, config_hash=None):
    """Merge chunk files into one Dataset with the sweep axes as named dimensions.

    Args:
      cfg: the resolved config.
      out: the run folder.
      axes: the swept fields.
      points: the grid points.
      chunks: the plan's chunks.
      config_hash: when given, every chunk must carry it and its planned points.

    Returns:
      The merged ``xarray.Dataset`` (attributes ``kind``, ``name``, ``config_yaml``). A damaged
      chunk, or one written by another run into the same folder, is a ``ConfigError`` naming it.
    """
    import xarray as xr

    shape = tuple(len(cfg["sweep"][a]) for a in axes)
    data, dims, coord_vals = _read_chunks(out, chunks, config_hash)
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
        full = _padded([rows[i] for i in range(len(points))])
        # A variable may not share its name with a dimension (e.g. a metric called "scale"
        # in a sweep over "scale"): it is stored as NAME_value.
        vname = f"{name}_value" if name in coords or name in axes or name in dims[name] else name
        ds[vname] = (tuple(axes) + tuple(dims[name]), full.reshape(shape + full.shape[1:]))
    # (the sphere kinds refuse sweeps that change the saved times: t1, dt)
    for dim in varying:
        ds.attrs[f"{dim}_varies"] = ("this coordinate differs between grid points; it is kept "
                                     "as an index 0, 1, ..., and its values are not stored")
    ds.attrs["kind"] = cfg["kind"]
    ds.attrs["name"] = cfg["name"]
    ds.attrs["config_yaml"] = yaml.safe_dump(cfg, sort_keys=False)
    return ds
