"""Results on disk: atomic writes, chunk files, the merged xarray Dataset.

Everything is written to a unique temporary name in the same folder and renamed into place
(``os.replace`` is atomic on POSIX): a reader never sees a half-written file under its
final name, an interrupted run leaves only finished chunks, and a failed write (a full
disk) leaves no temporary file. Files get the ordinary mode (0666 less the umask: 0644
by default), so colleagues on a shared file system can read every result.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

DATA_FILE = "data.nc"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"
CHUNK_DIR = "chunks"
LOCK_FILE = ".jaxdyn.lock"

# Signals seen by the CLI's handler. Its KeyboardInterrupt can be swallowed (Python ignores
# exceptions raised in garbage-collection callbacks such as XLA's); the engine checks this
# list between steps so that the run still ends as interrupted.
PENDING_SIGNALS: list = []


def file_mode() -> int:
    """The mode of a newly created ordinary file: 0666 less the process umask."""
    old = os.umask(0o022)
    os.umask(old)
    return 0o666 & ~old


def temp_path(path) -> Path:
    """A fresh, unique temporary name next to ``path`` (created empty, with :func:`file_mode`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, file_mode())
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file in the folder, then a rename).

    Args:
      path: the file (its folder is made).
      data: the bytes.

    Returns:
      The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            raise type(e)(e.errno, e.strerror, str(path)) from None  # a full disk: name the file
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically.

    Args:
      path: the file.
      text: the text.

    Returns:
      The path written.
    """
    return atomic_write_bytes(path, text.encode())


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def json_safe(o, nonfinite="text"):
    """``o`` with NumPy scalars and arrays as Python values and non-finite floats replaced.

    Args:
      o: nested dicts, lists and tuples of numbers, arrays and other JSON values.
      nonfinite: ``"text"`` (the strings "nan", "inf", "-inf") or ``None`` (JSON null).

    Returns:
      A value ``json.dumps`` writes as standard JSON.
    """
    if isinstance(o, dict):
        return {str(k): json_safe(v, nonfinite) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v, nonfinite) for v in o]
    if isinstance(o, np.ndarray):
        return json_safe(o.tolist(), nonfinite)
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not np.isfinite(o):
        if nonfinite is None:
            return None
        return "nan" if np.isnan(o) else ("inf" if o > 0 else "-inf")
    return o


def write_json(path, obj) -> Path:
    """Write ``obj`` as indented JSON, atomically (non-finite floats as the strings "nan", "inf").

    Args:
      path: the file.
      obj: a JSON-serialisable object (NumPy scalars and arrays, paths allowed).

    Returns:
      The path written.
    """
    return atomic_write_text(path, json.dumps(json_safe(obj), indent=2, default=_json_default) + "\n")


def read_json(path):
    """The JSON value of the file ``path``."""
    return json.loads(Path(path).read_text())


def chunk_path(out_dir, index: int) -> Path:
    """The file of chunk ``index`` in the run folder ``out_dir``."""
    return Path(out_dir) / CHUNK_DIR / f"chunk_{index:05d}.npz"


def write_chunk(path, arrays: dict, meta: dict) -> Path:
    """One finished chunk: arrays plus a JSON meta record, written atomically."""
    buf = io.BytesIO()
    payload = {f"a__{k}": np.asarray(v) for k, v in arrays.items()}
    payload["meta"] = np.frombuffer(json.dumps(json_safe(meta), default=_json_default).encode(), np.uint8)
    np.savez(buf, **payload)
    return atomic_write_bytes(path, buf.getvalue())


class DamagedFileError(OSError):
    """A results file cannot be read back (truncated, empty, not the expected format)."""


def read_chunk(path, meta_only: bool = False):
    """``(arrays, meta)`` of a chunk file.

    Args:
      path: the chunk file.
      meta_only: read the meta record alone (arrays ``{}``).

    Returns:
      The arrays by name and the meta record.

    Raises:
      FileNotFoundError: no such file.
      DamagedFileError: the file is damaged (empty, truncated, a missing or bad meta record).
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            arrays = {} if meta_only else {k[3:]: z[k] for k in z.files if k.startswith("a__")}
    except FileNotFoundError:
        raise
    except Exception as e:  # BadZipFile, EOFError, KeyError, ValueError, zlib/CRC errors …
        size = path.stat().st_size if path.exists() else 0
        raise DamagedFileError(f"chunk file {path} is damaged ({size} bytes; "
                               f"{type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise DamagedFileError(f"chunk file {path} is damaged (its meta record is not a mapping)")
    return arrays, meta


def write_dataset(ds, path) -> Path:
    """Write an xarray Dataset as netCDF-4 (h5netcdf engine), atomically.

    The file is built in memory and then written like every other result (a unique temporary
    name, renamed into place; removed if the write fails): a full disk or a lost permission is
    then an ``OSError`` of an ordinary write. HDF5 writing to a file that the disk cannot hold
    fails in its close, after which h5py's finaliser closes it again and the process dies of a
    segmentation fault.

    Args:
      ds: the Dataset.
      path: the file.

    Returns:
      The path written.
    """
    return atomic_write_bytes(path, ds.to_netcdf(engine="h5netcdf"))


def open_results(run_dir):
    """Open a finished run's Dataset (``xarray.open_dataset(run_dir/data.nc)``), loaded.

    Args:
      run_dir: the run folder.

    Returns:
      The Dataset.

    Raises:
      FileNotFoundError: the run has not finished (no ``data.nc``).
      DamagedFileError: ``data.nc`` cannot be read (it can be rebuilt with ``--resume``).
    """
    import xarray as xr

    p = Path(run_dir) / DATA_FILE
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist: the run in {run_dir} has not finished "
                                f"(resume it with `jaxdyn run --resume {run_dir}`)")
    try:
        with xr.open_dataset(p, engine="h5netcdf") as ds:
            return ds.load()
    except Exception as e:
        raise DamagedFileError(f"{p} is damaged ({p.stat().st_size} bytes; {type(e).__name__}: "
                               f"{' '.join(str(e).split())[:200]}); rebuild it from the chunks "
                               f"with `jaxdyn run --resume {run_dir}`") from None
