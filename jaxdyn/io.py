"""Results on disk: atomic writes, chunk files, the merged xarray Dataset.

Everything is written to a temporary name in the same folder and renamed into place
(``os.replace`` is atomic on POSIX): a reader never sees a half-written file under its
final name, and an interrupted run leaves only finished chunks.
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


def atomic_write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _clean(o):
    """Replace non-finite floats by strings so the JSON stays standard."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not np.isfinite(o):
        return "nan" if np.isnan(o) else ("inf" if o > 0 else "-inf")
    return o


def write_json(path, obj) -> Path:
    return atomic_write_text(path, json.dumps(_clean(obj), indent=2, default=_json_default) + "\n")


def read_json(path):
    return json.loads(Path(path).read_text())


def chunk_path(out_dir, index: int) -> Path:
    return Path(out_dir) / CHUNK_DIR / f"chunk_{index:05d}.npz"


def write_chunk(path, arrays: dict, meta: dict) -> Path:
    """One finished chunk: arrays plus a JSON meta record, written atomically."""
    buf = io.BytesIO()
    payload = {f"a__{k}": np.asarray(v) for k, v in arrays.items()}
    payload["meta"] = np.frombuffer(json.dumps(_clean(meta), default=_json_default).encode(), np.uint8)
    np.savez(buf, **payload)
    return atomic_write_bytes(path, buf.getvalue())


def read_chunk(path):
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        arrays = {k[3:]: z[k] for k in z.files if k.startswith("a__")}
    return arrays, meta


def write_dataset(ds, path) -> Path:
    """Write an xarray Dataset as netCDF-4 (h5netcdf engine), atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    ds.to_netcdf(tmp, engine="h5netcdf")
    os.replace(tmp, path)
    return path


def open_results(run_dir):
    """Open a finished run's Dataset (``xarray.open_dataset(run_dir/data.nc)``), loaded."""
    import xarray as xr

    p = Path(run_dir) / DATA_FILE
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist: the run in {run_dir} has not finished "
                                "(resume it with `jaxdyn run --resume DIR`)")
    with xr.open_dataset(p, engine="h5netcdf") as ds:
        return ds.load()
