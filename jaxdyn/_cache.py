"""Compile once: JAX's persistent compilation cache in the user's cache folder, and the
seconds spent compiling.

:func:`enable_compilation_cache` (one line in the library; the CLI calls it unless
``--no-cache`` or ``JAXDYN_NO_CACHE=1``) points JAX's persistent cache at
``$JAXDYN_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxdyn/jax``, else ``~/.cache/jaxdyn/jax``, in a
subfolder named by the jax and jaxlib versions, the platform asked for (``JAX_PLATFORMS``)
and a hash of the CPU's model and feature flags: a program compiled for one CPU is never
loaded on another (a home folder shared by machines with and without AVX-512), and JAX's
own key adds the backend, devices, compile options and XLA flags. Every program is cached,
however small or quick to compile (JAX's defaults skip those under 1 s of compilation).

:func:`compile_stats` counts, from this module's import on, the seconds JAX spent tracing,
lowering and compiling (a persistent-cache hit counts its loading time), and the cache hits.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import threading
from pathlib import Path

import jax

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_seconds",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_seconds",
    "/jax/core/compile/backend_compile_duration": "backend_seconds",
}
_HITS = "/jax/compilation_cache/cache_hits"
_lock = threading.Lock()
# Time spans (start, end) per part: a jit traced inside another's trace reports its own span
# inside the outer one, so the seconds are the length of the spans' union, not their sum.
_spans: dict = {k: [] for k in _EVENTS.values()}
_counts = {"compiles": 0, "cache_hits": 0, "program_hits": 0, "programs_written": 0,
           "program_load_failures": 0}


def _union(spans):
    """Merge overlapping spans in place (sorted); return their total length."""
    spans.sort()
    merged = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    spans[:] = [tuple(m) for m in merged]
    return sum(b - a for a, b in merged)


def _on_span(event, start_time, end_time, **kwargs):
    key = _EVENTS.get(event)
    if key is not None:
        with _lock:
            _spans[key].append((float(start_time), float(end_time)))
            if len(_spans[key]) > 4096:
                _union(_spans[key])
            if key == "backend_seconds":
                _counts["compiles"] += 1


def _on_event(event, **kwargs):
    if event == _HITS:
        with _lock:
            _counts["cache_hits"] += 1


jax.monitoring.register_event_time_span_listener(_on_span)
jax.monitoring.register_event_listener(_on_event)


def compile_stats() -> dict:
    """Cumulative compilation counters of this process (since jaxdyn's cache module loaded):
    ``compile_seconds`` (tracing + lowering + XLA compilation or loading from the persistent
    cache), its three parts, ``compiles`` (programs compiled or loaded) and ``cache_hits``
    (of those, loaded from the persistent cache), ``program_hits`` (of those, executables of
    :func:`cached_program` loaded without tracing), ``programs_written`` and
    ``program_load_failures`` (loaded programs that failed to run and were rebuilt); nested traces
    count once. Differences of two calls time a section."""
    with _lock:
        s = {k: _union(v) for k, v in _spans.items()}
        s["compile_seconds"] = _union([sp for v in _spans.values() for sp in v])
        s.update(_counts)
    return s


def _cpu_signature() -> str:
    """The CPU's model name and feature flags (Linux ``/proc/cpuinfo``), else the platform."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        keep = [ln.split(":", 1)[1].strip() for ln in text.split("\n\n")[0].splitlines()
                if ln.split(":", 1)[0].strip() in ("model name", "flags", "Features", "CPU part")]
        if keep:
            return "\n".join(keep)
    except (OSError, IndexError):  # pragma: no cover - not Linux
        pass
    return f"{platform.machine()} {platform.processor()}"


def cache_key_folder() -> str:
    """The subfolder name that keys the cache: jax, jaxlib, the platform asked for, the CPU."""
    import jaxlib

    plat = (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "auto").replace(",", "+")
    cpu = hashlib.sha256(_cpu_signature().encode()).hexdigest()[:12]
    return f"jax{jax.__version__}-jaxlib{jaxlib.__version__}-{plat}-{platform.machine()}-cpu{cpu}"


def default_cache_dir() -> Path:
    """``$JAXDYN_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxdyn/jax``, else ``~/.cache/jaxdyn/jax``."""
    if os.environ.get("JAXDYN_CACHE_DIR"):
        return Path(os.environ["JAXDYN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxdyn" / "jax"


def enable_compilation_cache(path=None, *, programs: bool = True):
    """Turn on JAX's persistent compilation cache (module doc) for this process: compiled
    programs are written to, and read back from, ``path`` (default :func:`default_cache_dir`)
    in a subfolder keyed by the jax/jaxlib versions, the platform and the CPU. Returns the
    folder used, or None when it cannot be created (the cache then stays off; nothing else
    changes). Call it before the first compilation to cache everything. ``programs``: also keep
    the executables of :func:`cached_program` (traced once; the module doc below), in the
    folder's ``jaxdyn-programs``."""
    root = Path(path) if path is not None else default_cache_dir()
    folder = root / cache_key_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            return None
    except OSError:
        return None
    from jax.experimental.compilation_cache import compilation_cache as cc

    if jax.config.jax_compilation_cache_dir != str(folder):
        cc.reset_cache()  # another folder was in use: start over with this one
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_enable_compilation_cache", True)
    _program_root[0] = folder / _PROGRAMS_SUBDIR if programs else None
    return folder


def disable_compilation_cache():
    """Turn the persistent cache off for this process (compiled programs stay in memory)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_compilation_cache_dir", None)
    cc.reset_cache()
    _program_root[0] = None


# ----------------------------------------------------------------------------------------
# Programs traced once: compiled executables kept beside JAX's cache, keyed on everything
# that can change the trace.
#
# JAX's persistent cache is keyed on the *lowered* program, so every process still traces and
# lowers a function before it can look the executable up (for the default run's segment
# program: 0.2 s of tracing and 0.06 s of lowering, quiet, against a 1.6 s first compile).
# :func:`cached_program` skips both: on a miss it lowers and compiles ahead of time
# (``jax.jit(f).lower(...).compile()``, the same executable a call would make) and
# serializes the executable (``jax.experimental.serialize_executable``) into
# ``<cache folder>/jaxdyn-programs/``; on a hit it loads it back and calls it. The key (a
# SHA-256 of the text below, stored whole in the file and compared on load) covers
#   * the caller's key: what determines the function (module-level functions by
#     ``module:qualname``, numbers exactly, strings, tuples; anything else: not cached);
#   * the arguments: the tree structure (node types and their static data, e.g. an
#     equinox module's static fields), each array's shape, dtype, weak type, sharding and
#     placement, each non-array leaf's value as above;
#   * jaxdyn's source files (a hash of every ``.py`` file of the package), the versions of
#     Python, jax, jaxlib, equinox and the other numeric dependencies, and the size and
#     modification time of every file of jax, jaxlib, equinox and jaxtyping (an edit in
#     place changes it);
#   * every JAX configuration value, JAX's trace context (thread-local settings such as a
#     ``default_matmul_precision`` context), the environment variables XLA_*, JAX_*, TF_*,
#     TPU_*, LIBTPU_*, JAXDYN_*, the devices (platform, kind, id, process), their backend's
#     version and the process count.
# A value whose text would not identify it (an object whose repr has a memory address, a
# closure, a lambda, a tracer: called inside another trace) makes the call uncacheable: it
# then goes through the function's ordinary ``jit``. Executables with host callbacks are
# never written (JAX's own cache refuses them too), nor those with custom calls other than
# LAPACK's (library kernels that JAX prepares while lowering: a program loaded without lowering
# would call them uninitialised; for LAPACK, the loader does what lowering does first), nor
# anything across several processes.
# Loading a file runs its executable: the folder must be trusted as JAX's own cache is.

import importlib.metadata as _metadata
import pickle
import re
import sys
import tempfile
import time
import types

import numpy as np

_PROGRAMS_SUBDIR = "jaxdyn-programs"
_program_root: list = [None]  # the folder programs go to; None: not stored (in memory only)
_FORMAT = "jaxdyn-program-v1"
_DEPENDENCIES = ("jax", "jaxlib", "equinox", "jaxtyping", "numpy", "ml_dtypes", "scipy",
                 "opt_einsum", "diffrax", "lineax", "optimistix", "optax", "ott-jax")
# (diffrax, lineax, optimistix and ott are traced into the cached diffrax and Sinkhorn programs)
_STAT_PACKAGES = ("jax", "jaxlib", "equinox", "jaxtyping", "diffrax", "lineax", "optimistix", "ott")
_ENV_PREFIXES = ("XLA_", "JAX_", "TF_", "TPU_", "LIBTPU_", "JAXDYN_", "EQX_")
_process_part: list = [None]


class Uncacheable(Exception):
    """A value whose text would not identify it: the call is not cached."""


def _record(part, t0, t1):
    with _lock:
        _spans[part].append((t0, t1))


def _fn_token(fn):
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not (isinstance(mod, str) and (mod == "jaxdyn" or mod.startswith("jaxdyn."))) \
            or "<" in qual or getattr(fn, "__closure__", None):
        raise Uncacheable(f"function {fn!r}")
    obj = sys.modules.get(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise Uncacheable(f"function {fn!r} is not its module's {qual}")
    return f"fn:{mod}:{qual}:{token(getattr(fn, '__defaults__', None))}:" \
           f"{token(sorted((getattr(fn, '__kwdefaults__', None) or {}).items()))}"


def token(v) -> str:
    """A text that identifies the static value ``v`` (:class:`Uncacheable` if there is none):
    None, bools, ints, floats (exactly, by ``float.hex``), complex, strings, bytes, NumPy
    dtypes and scalar types, tuples, lists and dicts of those, jaxdyn's module-level
    functions, ``functools.partial`` of those with such arguments, jaxdyn's dataclasses
    (field by field), meshes and enums."""
    if v is None or isinstance(v, (bool, str, bytes)):
        return f"{type(v).__name__}:{v!r}"
    if isinstance(v, (int, np.integer)):
        return f"int:{int(v)}"
    if isinstance(v, (float, np.floating)):
        return f"{type(v).__name__}:{float(v).hex()}"
    if isinstance(v, complex):
        return f"complex:{v.real.hex()},{v.imag.hex()}"
    if isinstance(v, (tuple, list)):
        return f"{type(v).__name__}(" + ",".join(token(x) for x in v) + ")"
    if isinstance(v, dict):
        return "dict(" + ",".join(f"{token(k)}={token(x)}" for k, x in
                                  sorted(v.items(), key=lambda kv: token(kv[0]))) + ")"
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return f"dtype:{np.dtype(v).str}"
    if isinstance(v, types.FunctionType):
        return _fn_token(v)
    if type(v) is functools.partial:
        return (f"partial:{token(v.func)}:{token(tuple(v.args))}:"
                f"{token(dict(v.keywords))}")
    if isinstance(v, jax.sharding.Mesh):
        return (f"mesh:{token(tuple(v.axis_names))}:{v.devices.shape}:"
                f"{[d.id for d in v.devices.flat]}:{token([str(t) for t in v.axis_types])}")
    import dataclasses
    import enum

    if dataclasses.is_dataclass(v) and not isinstance(v, type) \
            and type(v).__module__.startswith("jaxdyn") and "<" not in type(v).__qualname__:
        return (f"dataclass:{type(v).__module__}:{type(v).__qualname__}(" + ",".join(
            f"{f.name}={token(getattr(v, f.name))}" for f in dataclasses.fields(v)) + ")")
    if isinstance(v, enum.Enum):
        return f"enum:{type(v).__module__}.{type(v).__qualname__}.{v.name}"
    if type(v).__module__.startswith("equinox") and type(v).__name__ == "_Missing":
        return "equinox:Missing"  # equinox's placeholder in a module's static data
    raise Uncacheable(f"value of type {type(v).__name__}")


def _treedef_token(td) -> str:
    """The structure of a tree: node types by module:qualname and their static data."""
    nd = td.node_data()
    if nd is None:
        return "*"
    typ, aux = nd
    if typ.__module__ in ("builtins",) or typ.__module__.startswith(("jaxdyn", "equinox", "jax")):
        name = f"{typ.__module__}:{typ.__qualname__}"
    else:
        raise Uncacheable(f"tree node {typ!r}")
    if "<" in typ.__qualname__:
        raise Uncacheable(f"tree node {typ!r}")
    return f"{name}[{token(aux)}](" + ",".join(_treedef_token(c) for c in td.children()) + ")"


def _sharding_token(s) -> str:
    from jax.sharding import NamedSharding, SingleDeviceSharding

    if isinstance(s, SingleDeviceSharding):
        (dev,) = s.device_set
        return f"single:{dev.id}:{s.memory_kind}"
    if isinstance(s, NamedSharding):
        return f"named:{token(s.mesh)}:{s.spec!r}:{s.memory_kind}"
    raise Uncacheable(f"sharding {type(s).__name__}")


def _leaf_token(x) -> str:
    if isinstance(x, jax.core.Tracer):
        raise Uncacheable("a traced argument (called inside a transformation)")
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            raise Uncacheable(f"an array of extended dtype {x.dtype} (e.g. typed PRNG keys)")
        return (f"array:{x.shape}:{x.dtype.str}:{x.aval.weak_type}:"
                f"{_sharding_token(x.sharding)}:{x.committed}")
    if isinstance(x, (np.ndarray, np.generic)):
        return f"host:{x.shape}:{x.dtype.str}"
    return "static:" + token(x)


def _sources_digest(root=None) -> str:
    """A hash of every ``.py`` file under ``root`` (default: the jaxdyn package), by path."""
    h = hashlib.sha256()
    root = Path(root) if root is not None else Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _dependencies_part() -> str:
    import importlib.util

    lines = [f"python:{sys.version}", f"implementation:{sys.implementation.name}"]
    for d in _DEPENDENCIES:
        try:
            lines.append(f"{d}:{_metadata.version(d)}")
        except _metadata.PackageNotFoundError:
            lines.append(f"{d}:absent")
    for pkg in _STAT_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            lines.append(f"{pkg}:absent")
            continue
        h = hashlib.sha256()
        for loc in sorted(spec.submodule_search_locations):
            for dirpath, dirnames, files in os.walk(loc):
                dirnames.sort()
                for f in sorted(files):
                    if f.endswith((".py", ".so", ".pyd")):
                        st = os.stat(os.path.join(dirpath, f))
                        h.update(f"{dirpath}/{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        lines.append(f"{pkg}-files:{h.hexdigest()}")
    return "\n".join(lines)


def _environment_part() -> str:
    """What can change a trace besides the function and its arguments (module doc)."""
    from jax._src import config as jconfig

    if _process_part[0] is None:  # files and versions: once per process
        _process_part[0] = f"jaxdyn-sources:{_sources_digest()}\n{_dependencies_part()}"
    lines = [_process_part[0]]
    values = jax.config.values  # a fresh dict on every read: read once
    for name in sorted(values):
        text = repr(getattr(jax.config, name, values[name]))
        if " at 0x" in text:
            raise Uncacheable(f"jax config {name}")
        lines.append(f"config:{name}={text}")
    try:  # JAX's own jit cache keys on this tuple (not public API: none, not cached)
        context = tuple(jconfig.trace_context())
    except Exception as e:  # noqa: BLE001
        raise Uncacheable("JAX's trace context is not available") from e
    for i, v in enumerate(context):
        if type(v).__name__ == "AxisEnv":
            if v.axis_sizes or v.spmd_axis_names or v.explicit_mesh_axis_names:
                raise Uncacheable("inside a named axis")
            text = "AxisEnv()"
        else:
            text = repr(v)
        if " at 0x" in text:
            raise Uncacheable(f"trace context entry {text[:60]}")
        lines.append(f"context:{i}={text}")
    lines += [f"env:{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)]
    # equinox's error mode as its error_if reads it now (EQX_ON_ERROR, or a caller's switch such as
    # jaxdyn._host_checked's): a program traced with the checks off must not serve one with them on
    eqx_errors = sys.modules.get("equinox._errors")
    lines.append(f"equinox-on-error:{getattr(eqx_errors, 'EQX_ON_ERROR', None)!r}")
    devs = jax.devices()
    lines.append(f"backend:{devs[0].client.platform}:{devs[0].client.platform_version}")
    lines += [f"device:{d.platform}:{d.device_kind}:{d.id}:{d.process_index}" for d in devs]
    lines.append(f"processes:{jax.process_count()}:{jax.process_index()}")
    return "\n".join(lines)


def program_key(key, leaves, treedef) -> str:
    """The text that keys a program (module doc); :class:`Uncacheable` if it cannot be formed."""
    parts = [_FORMAT, "key:" + token(key), "tree:" + _treedef_token(treedef)]
    parts += ["leaf:" + _leaf_token(x) for x in leaves]
    parts.append(_environment_part())
    return "\n".join(parts)


def _program_file(text: str):
    root = _program_root[0]
    if root is None or jax.process_count() > 1 or not jax.config.jax_enable_compilation_cache \
            or jax.config.jax_compilation_cache_dir != str(root.parent):
        return None  # off, or JAX's cache was turned off or elsewhere since
    return Path(root) / (hashlib.sha256(text.encode()).hexdigest() + ".jaxexe")


def _lapack_initializer():
    """jaxlib's LAPACK set-up, or None. JAX calls it while lowering a LAPACK custom call
    (``jaxlib.lapack.prepare_lapack_call``: it fills the table of LAPACK kernels the CPU
    executable calls); a program loaded without lowering needs it called first (without it a
    loaded SVD program crashed, jax 0.10.2). Programs with other custom calls are not stored."""
    try:
        from jaxlib import lapack

        init = lapack._lapack.initialize
    except (ImportError, AttributeError):
        return None
    return init if callable(init) else None


def _load_program(path: Path, text: str, in_tree):
    from jax.experimental import serialize_executable

    try:
        with open(path, "rb") as f:
            stored = pickle.load(f)
        if stored.get("key") != text:
            return None
        if stored.get("lapack"):  # what lowering a LAPACK call does first (_lapack_initializer)
            _lapack_initializer()()
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in stored["devices"]]  # the executable's, in its order
        return serialize_executable.deserialize_and_load(stored["payload"], in_tree,
                                                         stored["out_tree"],
                                                         execution_devices=devices)
    except Exception:  # noqa: BLE001 - a missing, damaged or foreign file is a miss
        return None


def _store_program(path: Path, text: str, compiled) -> bool:
    from jax.experimental import serialize_executable

    try:
        unloaded = getattr(compiled._executable, "_unloaded_executable", None)
        if unloaded is None or any(getattr(unloaded, k, None) for k in (
                "host_callbacks", "keepalive", "ordered_effects", "unordered_effects", "mut")):
            return False  # Python objects the executable needs: they do not travel
        targets = set(re.findall(r'custom_call_target="([^"]*)"', compiled.as_text()))
        lapack = bool(targets) and all(t.startswith("lapack_") for t in targets)
        if targets and not (lapack and _lapack_initializer() is not None):
            # a library kernel that JAX prepares while lowering: loaded without lowering, it
            # would run uninitialised. Left to JAX's own cache.
            return False
        payload, _, out_tree = serialize_executable.serialize(compiled)
        devices = [d.id for d in unloaded.device_list]
        blob = pickle.dumps({"key": text, "payload": payload, "out_tree": out_tree,
                             "devices": devices, "lapack": lapack})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".jaxexe")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True
    except Exception:  # noqa: BLE001 - not written: the next process compiles again
        return False


_no_persistent_lock = threading.RLock()


def _build_storable(build):
    """``build()``, compiled by XLA rather than taken from JAX's persistent cache: an
    executable JAX loaded from its cache serializes without the object code of its kernels
    (jax 0.10.2: stored again and loaded by another process, it fails with XLA's "Function
    broadcast_add_fusion not found"; ``tests/test_program_cache.py``). A build that JAX's
    cache answered (its hit counter moved) is compiled again with that cache off."""
    with _lock:
        hits = _counts["cache_hits"]
    compiled = build()
    with _lock:
        hit = _counts["cache_hits"] != hits
    if not hit:
        return compiled
    with _no_persistent_lock:
        was = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)
        try:
            return build()
        finally:
            jax.config.update("jax_enable_compilation_cache", was)


class _Loaded:
    """A program loaded from the programs folder, checked on its first call: one that fails
    to run (XLA said "Function copy_copy_fusion not found" for one stored program loaded in
    an experiment's process, jax 0.10.2) is deleted, built again from the trace and run;
    ``compile_stats()['program_load_failures']`` counts these."""

    def __init__(self, compiled, path, text, build):
        self.compiled, self.path, self.text, self.build = compiled, path, text, build
        self.checked = False

    def __call__(self, *args):
        if self.checked:
            return self.compiled(*args)
        try:
            out = self.compiled(*args)
            jax.block_until_ready(out)
        except Exception as e:  # noqa: BLE001 - an infrastructure failure: rebuild
            import warnings

            warnings.warn(f"jaxdyn: a stored program failed to run ({type(e).__name__}: "
                          f"{str(e)[:200]}); it is compiled again and its file replaced",
                          RuntimeWarning, stacklevel=3)
            with _lock:
                _counts["program_load_failures"] += 1
            try:
                self.path.unlink()
            except OSError:
                pass
            self.compiled = _build_storable(self.build)
            if _store_program(self.path, self.text, self.compiled):
                with _lock:
                    _counts["programs_written"] += 1
            out = self.compiled(*args)
        self.checked = True
        return out


def _load_or_build(text: str, n_args: int, build, t0: float):
    """The executable keyed by ``text`` (positional array arguments only): loaded from the
    programs folder (checked on its first call, :class:`_Loaded`), else ``build()`` (a
    :class:`jax.stages.Compiled`) and written there. ``t0``: when forming the key began
    (counted in ``compile_seconds``)."""
    path = _program_file(text)
    if path is not None and path.exists():
        compiled = _load_program(path, text, jax.tree.structure((tuple(range(n_args)), {})))
        if compiled is not None:
            compiled = _Loaded(compiled, path, text, build)
            with _lock:
                _counts["compiles"] += 1
                _counts["cache_hits"] += 1
                _counts["program_hits"] += 1
            _record("backend_seconds", t0, time.time())
            return compiled
    _record("trace_seconds", t0, time.time())  # forming the key, looking: part of this trace
    compiled = _build_storable(build) if path is not None else build()
    t2 = time.time()
    if path is not None and _store_program(path, text, compiled):
        with _lock:
            _counts["programs_written"] += 1
        _record("backend_seconds", t2, time.time())
    return compiled


def compiled_program(key, n_args: int, build):
    """``build()`` (a :class:`jax.stages.Compiled` of ``n_args`` positional arrays), or the
    executable an earlier process stored under ``key`` (module doc), which must determine
    the program completely together with jaxdyn's sources (function, shapes, dtypes, static
    values, devices, compiler options). Not stored when the key cannot be formed."""
    t0 = time.time()
    try:
        text = "\n".join([_FORMAT, "aot-key:" + token(key), _environment_part()])
    except Uncacheable:
        return build()
    return _load_or_build(text, n_args, build, t0)


def cached_program(fn, key, *, fallback=None):
    """``fn`` compiled once per argument signature and, when the compilation cache is on
    (:func:`enable_compilation_cache`), kept on disk so that another process loads the
    executable instead of tracing and lowering ``fn`` again (module doc: the key).

    ``key`` must determine ``fn`` together with jaxdyn's sources: e.g. the module-level
    function it applies and the numbers it closes over (``token`` must accept it). The
    returned ``call(*args, **kwargs)`` takes trees of arrays and static leaves (non-array
    leaves are baked into the program, as ``equinox.filter_jit`` does) and returns ``fn``'s
    outputs, a tree of arrays (tuples, lists, dicts: the output structure is stored with the
    executable). A call whose key cannot be formed (see :class:`Uncacheable`) goes to
    ``fallback`` (default ``equinox.filter_jit(fn)``)."""
    memo: dict = {}
    if fallback is None:
        import equinox as eqx

        fallback = eqx.filter_jit(fn)
    try:
        token(key)
    except Uncacheable:  # a key that can never be formed: the ordinary jit
        return fallback

    def call(*args, **kwargs):
        t0 = time.time()
        leaves, treedef = jax.tree.flatten((args, kwargs) if kwargs else args)
        try:
            text = program_key(key, leaves, treedef)
        except Uncacheable:
            return fallback(*args, **kwargs)
        arr = [i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, np.ndarray, np.generic))]
        flat = [leaves[i] for i in arr]
        compiled = memo.get(text)
        if compiled is None:
            def flat_fn(*a):
                vals = list(leaves)
                for i, x in zip(arr, a):
                    vals[i] = x
                if kwargs:
                    a2, kw = treedef.unflatten(vals)
                    return fn(*a2, **kw)
                return fn(*treedef.unflatten(vals))

            def build():
                # a new function object per build: JAX's in-memory caches (keyed on the
                # function) must not hand back an executable it loaded from its own cache
                # (see _build_storable)
                def flat_fn_(*a):
                    return flat_fn(*a)

                flat_fn_.__name__ = flat_fn_.__qualname__ = "flat_fn"
                return jax.jit(flat_fn_).lower(*flat).compile()

            compiled = memo[text] = _load_or_build(text, len(flat), build, t0)
        return compiled(*flat)

    return call


def cached_jit(fn):
    """Decorator: ``fn`` (a module-level jaxdyn function whose outputs are arrays, tuples,
    lists or dicts of arrays) through :func:`cached_program`, keyed by its module and name
    (its code is in the key through jaxdyn's sources); ``equinox.filter_jit`` semantics for
    static arguments. Called under a transformation, or with what the key cannot name, it is
    ``equinox.filter_jit(fn)``."""
    call = cached_program(fn, (f"cached_jit:{fn.__module__}:{fn.__qualname__}",))
    return functools.wraps(fn)(call)
