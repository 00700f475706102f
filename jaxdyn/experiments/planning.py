"""Planning a run: the resolved config, its grid, the chunks, and the memory they need.

    resolve the config → grid points (the product of the sweep's values) → chunks (groups of
    points sharing every non-batch field, cut to the memory budget) → the memory estimate,
    refused before any allocation when the host or a device has less.

Nothing here runs a computation or touches the run folder; the limits of the machine come in
as arguments (:mod:`.runner` measures them).
"""

from __future__ import annotations

import dataclasses
import itertools
import json

from ..config import ConfigError, Field, validate_section, validate_sweep

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

# Memory the process needs beyond its arrays: XLA compilation, the CPU runtime's buffers
# (which grow with loop iterations when the host cores are several devices), SciPy and
# matplotlib. Calibrated from the peak resident memory that runs record
# (``measured_peak_rss_bytes`` in their summary.json) against their chunk data.
RUNTIME_ALLOWANCE = 320 * 2**20
RUNTIME_ALLOWANCE_PER_DEVICE = 160 * 2**20


def _plain_name(v: str):
    if not v or v in (".", "..") or v.startswith(".") or any(c in v for c in "/\\\0") \
            or len(v) > 200:
        return ("must be a plain file name (no '/', no leading '.', at most 200 characters): "
                "it names the folder runs/NAME-TIMESTAMP")
    return None


def resolve_config(raw: dict) -> dict:
    """Validate a raw config (from YAML) into a resolved one, with defaults filled.

    Args:
      raw: the config as read from YAML (or a resolved config: resolving is idempotent).

    Returns:
      The resolved config: every field of the engine and of the kind, ``sweep`` validated.

    Raises:
      ConfigError: not a mapping, no ``kind``, or a field that fails validation (named).
    """
    from .kinds import get_kind

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


def grid_points(cfg: dict) -> tuple[list[str], list[dict]]:
    """The sweep's axes and its points, in row-major order of the axes.

    Args:
      cfg: a resolved config.

    Returns:
      ``(axes, points)``: the swept field names and one ``{axis: value}`` a grid point.
    """
    axes = list(cfg["sweep"])
    values = [cfg["sweep"][a] for a in axes]
    pts = [dict(zip(axes, combo)) for combo in itertools.product(*values)]
    return axes, pts


def point_config(cfg: dict, point: dict) -> dict:
    """The config of one grid point: ``cfg`` without ``sweep``, the point's values filled in.

    Args:
      cfg: a resolved config.
      point: ``{axis: value}``.

    Returns:
      The point's config.
    """
    pc = {k: v for k, v in cfg.items() if k != "sweep"}
    pc.update(point)
    return pc


def memory_budget(cfg: dict, n_devices: int, total_host: int, device_limit: int | None) -> int:
    """Bytes for one chunk.

    Args:
      cfg: a resolved config (``memory_budget_gb`` wins when set).
      n_devices: devices one chunk is sharded over.
      total_host: the host's memory in bytes.
      device_limit: bytes on one accelerator (None on CPU).

    Returns:
      ``memory_budget_gb``, else a quarter of the host's memory, at most half of the
      accelerators' memory.
    """
    if cfg.get("memory_budget_gb"):
        return int(cfg["memory_budget_gb"] * 2**30)
    budget = total_host // 4
    if device_limit is not None:
        budget = min(budget, n_devices * device_limit // 2)
    return budget


def split_chunks(cfg: dict, kind, points: list, n_devices: int, budget: int):
    """Group points by their non-batch fields, then split each group into chunks.

    Args:
      cfg: a resolved config (``chunk_size`` wins when set).
      kind: the experiment kind (its ``BATCH_AXES`` and ``estimate_bytes``).
      points: the grid points.
      n_devices: devices a chunk is sharded over (automatic sizes are multiples of it).
      budget: bytes for one chunk.

    Returns:
      ``(chunks, est)``: lists of point indices, and each chunk's estimated bytes.
    """
    batch = set(getattr(kind, "BATCH_AXES", ()))
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        key = json.dumps({k: v for k, v in p.items() if k not in batch}, sort_keys=True)
        groups.setdefault(key, []).append(i)
    chunks, est = [], {}
    for idxs in groups.values():
        per_point = int(kind.estimate_bytes(point_config(cfg, points[idxs[0]])))
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


@dataclasses.dataclass(frozen=True)
class Plan:
    """The grid of a run and its chunks.

    Attributes:
      axes: the swept fields.
      points: one ``{axis: value}`` a grid point (``[{}]`` without a sweep).
      chunks: point indices, one list a chunk (chunk files are numbered by position).
      chunk_bytes: estimated bytes of each chunk.
    """

    axes: list
    points: list
    chunks: list
    chunk_bytes: dict

    @property
    def peak_chunk_bytes(self) -> int:
        """The largest chunk's estimate."""
        return max(self.chunk_bytes.values())

    @property
    def per_point_bytes(self) -> int:
        """The largest estimate of one point."""
        return max(self.chunk_bytes[i] // max(len(c), 1) for i, c in enumerate(self.chunks))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What a run needs, in bytes.

    Attributes:
      per_point: one grid point (the largest).
      peak_chunk: the largest chunk (over all its devices).
      process: the whole process: what runs now, the runtime's allowance, the largest chunk
        (device buffers and their host copies) and the merged results.
      allowance: the runtime's share of ``process``.
      n_devices: the devices a chunk is sharded over.
    """

    per_point: int
    peak_chunk: int
    process: int
    allowance: int = 0
    n_devices: int = 1


def estimate_memory(cfg: dict, kind, plan: Plan, devices: tuple[int, int], base_rss: int) -> MemoryEstimate:
    """The memory estimate of a planned run.

    Args:
      cfg: a resolved config.
      kind: the experiment kind (its ``output_bytes``).
      plan: the run's plan.
      devices: ``(devices a chunk spans, devices of this process)``.
      base_rss: bytes the process holds already.

    Returns:
      The :class:`MemoryEstimate`.
    """
    out_bytes = sum(int(kind.output_bytes(point_config(cfg, p)))
                    for p in plan.points)
    n_dev, local = devices
    allowance = RUNTIME_ALLOWANCE + RUNTIME_ALLOWANCE_PER_DEVICE * (local - 1)
    process = base_rss + allowance + 2 * plan.peak_chunk_bytes + 3 * out_bytes
    return MemoryEstimate(plan.per_point_bytes, plan.peak_chunk_bytes, process, allowance, n_dev)


def _halved(value):
    """``value`` (an int > 1, or a list of them) halved; None where there is nothing to halve."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 1:
        return value // 2
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in value) and max(value) > 1:
        return [max(v // 2, 1) for v in value]
    return None


def driving_fields(cfg: dict, kind) -> list:
    """The integer fields whose size drives one grid point's memory estimate, largest effect first.

    Each integer field of the kind (and of its sections) is halved in turn at the sweep's largest
    point; those that cut the estimate by a quarter or more are named (at most two, within a
    factor 1.5 of the strongest).

    Args:
      cfg: a resolved config.
      kind: its kind.

    Returns:
      ``[(dotted name, value)]``.
    """
    point = {a: max(v) if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
             else v[0] for a, v in cfg.get("sweep", {}).items() if v}
    pc = point_config(cfg, point)
    try:
        base = kind.estimate_bytes(pc)
    except Exception:  # noqa: BLE001 - no estimate: nothing to name
        return []
    found = []

    def probe(name, value, changed, default):
        try:
            ratio = kind.estimate_bytes(changed) / max(base, 1)
        except Exception:  # noqa: BLE001 - a value the estimate cannot take
            return
        if ratio <= 0.75:  # a value above its default first: that is what the user raised
            top = max(value) if isinstance(value, list) else value
            above = isinstance(default, (int, list)) and top > (
                max(default, default=0) if isinstance(default, list) else default)
            found.append((not above, ratio, name, value))

    for name, field in kind.SCHEMA.items():
        v = pc.get(name)
        if field.kind == "section" and field.schema and isinstance(v, dict):
            for sub, sf in field.schema.items():
                h = _halved(v.get(sub))
                if h is not None:
                    probe(f"{name}.{sub}", v[sub], {**pc, name: {**v, sub: h}}, sf.default)
        elif field.kind in ("int", "list"):
            h = _halved(v)
            if h is not None:
                probe(name, v, {**pc, name: h}, field.default)
    found.sort(key=lambda f: f[:2])
    return [(n, v) for a, r, n, v in found[:2] if a == found[0][0] and r <= 1.5 * found[0][1]]


def refuse_oversized(cfg: dict, need: MemoryEstimate, host: tuple[int, str], device_limit: int | None,
                     kind=None):
    """Refuse, before any allocation, a run whose estimate exceeds what the machine has.

    Args:
      cfg: a resolved config (the refusal names the field that drives the estimate).
      need: the estimate.
      host: ``(bytes available on the host, where that bound comes from)``.
      device_limit: bytes on one accelerator (None on CPU).
      kind: the experiment kind (names the field that drives one grid point's estimate:
        :func:`driving_fields`; None: ``n`` where the config has one).

    Raises:
      ConfigError: the process needs more than the host has, or a chunk more than a device.
    """
    avail, where = host
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    # a field of the point drives it when one grid point alone is too big (a smaller sweep
    # cannot help then)
    alone = 2 * need.per_point > 0.5 * need.process or 2 * need.per_point > avail
    drivers = driving_fields(cfg, kind) if alone and kind is not None else []
    if drivers:
        field = "config field " + " or ".join(f"'{n}' (= {v})" for n, v in drivers)
    elif alone and "n" in cfg:
        field = f"config field 'n' (= {cfg['n']})"
    elif cfg.get("sweep"):
        field = f"config field 'sweep' ({', '.join(f'{k}: {len(v)} values' for k, v in cfg['sweep'].items())})"
    else:
        field = "this config"
    if need.process > avail:
        raise ConfigError(f"{field}: the run needs an estimated {mib(need.process)} of memory "
                          f"({mib(need.per_point)} per grid point), more than the {mib(avail)} "
                          f"{where}; make it smaller")
    per_device = max(need.per_point, -(-need.peak_chunk // max(need.n_devices, 1)))
    if device_limit is not None and per_device > device_limit:
        raise ConfigError(f"{field}: a chunk needs an estimated {mib(per_device)} on each device, "
                          f"more than its {mib(device_limit)}; make it smaller (or set chunk_size)")
