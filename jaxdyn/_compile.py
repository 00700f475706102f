"""Compile once: JAX's persistent compilation cache in the user's cache folder.

It also counts the seconds spent compiling.

Everything here goes through JAX's public configuration (``jax.config``) and its public
monitoring hooks (``jax.monitoring``); jaxdyn keeps no executables of its own.

:func:`enable_compilation_cache` (one line in the library; the CLI calls it unless
``--no-cache`` or ``JAXDYN_NO_CACHE=1``) points JAX's persistent cache at
``$JAXDYN_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxdyn/jax``, else ``~/.cache/jaxdyn/jax``, in a
subfolder named by the jax and jaxlib versions, the platform asked for (``JAX_PLATFORMS``)
and a hash of the CPU's model and feature flags: a program compiled for one CPU is never
loaded on another (a home folder shared by machines with and without AVX-512), and JAX's
own key adds the backend, devices, compile options and XLA flags. Every program is cached,
however small or quick to compile (JAX's defaults skip those under 1 s of compilation).
A later process still traces and lowers each function (JAX's cache is keyed on the lowered
program); it loads the compiled executable instead of compiling it. Programs that hold a
host callback (equinox's runtime checks with ``EQX_ON_ERROR=raise``, the default) are not
written by JAX and compile again in every process.

:func:`compile_stats` counts, from this module's import on, the seconds JAX spent tracing,
lowering and compiling (a persistent-cache hit counts its loading time), and the cache hits.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from pathlib import Path

import jax

__all__ = ["compile_stats", "default_cache_dir", "cache_key_folder", "enable_compilation_cache",
           "disable_compilation_cache"]

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
_counts = {"compiles": 0, "cache_hits": 0}


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
    """Cumulative compilation counters of this process, since jaxdyn's compile module loaded.

    Nested traces count once. The difference of two calls times a section of a program.

    Returns:
        A dict with ``compile_seconds`` (tracing + lowering + XLA compilation, or loading from
        the persistent cache), its three parts ``trace_seconds``, ``lower_seconds`` and
        ``backend_seconds``, ``compiles`` (programs compiled or loaded) and ``cache_hits``
        (of those, loaded from the persistent cache).
    """
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
    """The name of the cache subfolder of this machine and installation.

    Returns:
        A folder name made of the jax and jaxlib versions, the platform asked for
        (``JAX_PLATFORMS``), the machine and a hash of the CPU's model and feature flags.
    """
    import jaxlib

    plat = (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "auto").replace(",", "+")
    cpu = hashlib.sha256(_cpu_signature().encode()).hexdigest()[:12]
    return f"jax{jax.__version__}-jaxlib{jaxlib.__version__}-{plat}-{platform.machine()}-cpu{cpu}"


def default_cache_dir() -> Path:
    """The root folder of jaxdyn's compilation cache.

    Returns:
        ``$JAXDYN_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxdyn/jax``, else ``~/.cache/jaxdyn/jax``.
    """
    if os.environ.get("JAXDYN_CACHE_DIR"):
        return Path(os.environ["JAXDYN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxdyn" / "jax"


def enable_compilation_cache(path=None):
    """Turn on JAX's persistent compilation cache for this process.

    Compiled programs are written to, and read back from, a subfolder of ``path`` keyed by
    :func:`cache_key_folder`. Call it before the first compilation to cache everything.

    Args:
        path: the cache's root folder (default :func:`default_cache_dir`).

    Returns:
        The folder used, or None when it cannot be created or written (the cache then stays
        off; nothing else changes).
    """
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
    return folder


def disable_compilation_cache():
    """Turn the persistent cache off for this process (compiled programs stay in memory)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_compilation_cache_dir", None)
    cc.reset_cache()
