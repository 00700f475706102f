"""Experiment configs: YAML → validated, resolved dictionaries.

A config is a mapping with a ``kind`` (which experiment runs it), scalar parameters,
nested sections (``weights``, ``init``, ``figures``, …) and an optional ``sweep`` section
declaring a grid: ``sweep: {beta: [1, 10, 100], seed: [0, 1]}``. Each kind declares its
fields with :class:`Field`; validation fills defaults and rejects, before any compute, an
unknown field, a value of the wrong type or out of range, naming the field and the
expected form (``ConfigError``). Every problem of a mapping is found before it is refused: one
error names them all, an unknown field with the closest known names.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

REQUIRED = object()


class ConfigError(ValueError):
    """A config field is wrong: the message names it and the expected form.

    A config check names every problem it finds in one error: its message joins them, numbered,
    on one line.

    Args:
      message: what is wrong.
      problems: each problem found, one message each (default: ``message`` alone).

    Attributes:
      problems: each problem found, one message each.
    """

    def __init__(self, message: str = "", problems=None):
        super().__init__(message)
        self.problems = tuple(problems) if problems else (message,)


def _problems(e: ConfigError) -> tuple:
    """The problems of an error (an error of a subclass made elsewhere: its message)."""
    return getattr(e, "problems", None) or (str(e),)


def _joined(problems: list, hint: str = "") -> str:
    """The message of an error naming every problem.

    Args:
      problems: the problems' messages (at least one).
      hint: a pointer appended to the message (where the known fields are listed).

    Returns:
      One problem: its message; several: ``N problems in the config: (1) ...; (2) ...``.
    """
    if len(problems) == 1:
        msg = problems[0]
    else:
        msg = f"{len(problems)} problems in the config: " + "; ".join(
            f"({i}) {p}" for i, p in enumerate(problems, start=1))
    return msg + (f"; {hint}" if hint else "")


#: a section with at most this many fields lists them for an unknown field with no close name
_LIST_AT_MOST = 15


def _unknown_field(path: str, key, known) -> str:
    """The message for an unknown field: its closest known names, or (few) the known ones.

    Args:
      path: the field's dotted path.
      key: the unknown name.
      known: the names known at that place.

    Returns:
      ``unknown config field 'PATH'; did you mean 'A' or 'B'?`` (``difflib.get_close_matches``);
      with no close name, the known names when there are at most 15 of them (a section).
    """
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=3, cutoff=0.6)
    msg = f"unknown config field '{path}'"
    if close:
        return msg + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    if len(known) <= _LIST_AT_MOST:
        return msg + "; known fields here: " + ", ".join(sorted(map(str, known)))
    return msg


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also refuses a key given twice in one mapping.

    Tags such as ``!!python/...`` are refused, never executed; YAML itself would keep the last
    value of a repeated key.
    """

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` (flattened by PyYAML)
                continue
            try:
                key = self.construct_object(key_node, deep=True)
                hash(key)
            except Exception:  # an unhashable key: SafeLoader's own error follows
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1}; "
                    f"first given on line {seen[key]})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str):
    """Parse YAML text safely (no tags executed, duplicate keys refused).

    Args:
      text: the YAML text.
      where: what it is (a file or an override), for the error message.

    Returns:
      The parsed value.

    Raises:
      ConfigError: the text is not valid YAML (naming ``where``).
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        msg = " ".join(str(e).split()).replace(' in "<unicode string>"', "")
        raise ConfigError(f"{where} is not valid YAML: {msg}") from None


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field.

    Attributes:
      kind: "int" | "float" | "str" | "bool" | "list" | "section" | "any" | "matrix".
      default: default value (``REQUIRED`` if none).
      doc: the expected form, shown in errors.
      check: optional predicate on the (coerced) value returning an error string or None.
      choices: allowed values for "str" fields.
      item: element kind for "list" fields ("int", "float", "str", "any").
      schema: sub-fields for "section" fields (None: free-form mapping).
      sweepable: may appear under ``sweep:``.
    """

    kind: str
    default: Any = REQUIRED
    doc: str = ""
    check: Optional[Callable[[Any], Optional[str]]] = None
    choices: Optional[tuple] = None
    item: str = "any"
    schema: Optional[Mapping[str, "Field"]] = None
    sweepable: bool = False


def format_value(value) -> str:
    """A config value as it is written in YAML (``null``, ``true``, ``[1.0, 2.0]``, ``rk4``).

    Args:
      value: a default or a choice of a field.

    Returns:
      The YAML text (flow style).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def schema_rows(schema: Mapping[str, Field], prefix: str = "") -> list[dict]:
    """The fields of a schema for a reference listing, sections flattened to dotted names.

    Args:
      schema: field name → :class:`Field`.
      prefix: the dotted path of the section (``""`` at the top level).

    Returns:
      One dict a field, in schema order (a section before its sub-fields): ``name`` (dotted),
      ``type`` (``"int"``, ``"list of float"``, ``"matrix"`` (a list of rows), ``"section"``,
      …), ``default`` (YAML text; ``"required"`` when there is none), ``choices`` (YAML texts,
      empty when any value of the type goes), ``sweepable`` and ``doc``.
    """
    rows = []
    for key, f in schema.items():
        name = f"{prefix}{key}"
        kind = f"list of {f.item}" if f.kind == "list" and f.item != "any" else f.kind
        if f.default is REQUIRED:
            default = "required"
        elif f.kind == "section" and f.schema is not None:
            default = "(its fields)"
        else:
            default = format_value(f.default)
        rows.append({"name": name, "type": kind, "default": default,
                     "choices": [format_value(c) for c in f.choices or ()],
                     "sweepable": f.sweepable, "doc": f.doc})
        if f.kind == "section" and f.schema is not None:
            rows += schema_rows(f.schema, f"{name}.")
    return rows


def positive(v):
    """A field check: None if ``v > 0``, else the problem."""
    return None if v > 0 else "must be > 0"


def nonnegative(v):
    """A field check: None if ``v >= 0``, else the problem."""
    return None if v >= 0 else "must be >= 0"


def open_unit(v):
    """A field check: None if ``0 < v < 1``, else the problem."""
    return None if 0 < v < 1 else "must be in (0, 1)"


def at_least(k):
    """A field check: None if ``v >= k``, else the problem."""
    return lambda v: None if v >= k else f"must be >= {k}"


def nonempty(v):
    """A field check: None if the list ``v`` holds at least one value, else the problem."""
    return None if len(v) else "expected a non-empty list"


def all_positive(v):
    """A field check: None if the list ``v`` is non-empty and every value is > 0, else the problem."""
    if not v:
        return "expected a non-empty list of values > 0"
    return None if all(x > 0 for x in v) else "every value must be > 0"


def _coerce(path: str, value, f: Field):
    k = f.kind
    what = f.doc or k
    if k == "any":
        return value
    if k == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config field '{path}': expected true/false ({what}), got {value!r}")
    if k == "int":
        if isinstance(value, float) and not math.isfinite(value):  # int() of it raised
            raise ConfigError(f"config field '{path}': expected an integer ({what}), got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"config field '{path}': expected an integer ({what}), got {value!r}")
        value = int(value)
        if path.split(".")[-1].split("[")[0] == "seed":
            # PRNGKey(seed) keeps 32 bits without x64: 2**32 would silently equal 0.
            if not 0 <= value < 2**32:
                raise ConfigError(f"config field '{path}': a seed must be in [0, 2**32), got {value}")
        elif not -2**63 <= value < 2**63:
            raise ConfigError(f"config field '{path}': {value} is out of range (a 64-bit integer, "
                              f"|value| < 2**63)")
    elif k == "float":
        if isinstance(value, str):
            try:
                value = float(value)  # YAML reads 1e-3 as a string
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config field '{path}': expected a number ({what}), got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"config field '{path}': must be finite, got {value!r}")
    elif k == "str":
        if not isinstance(value, str):
            raise ConfigError(f"config field '{path}': expected a string ({what}), got {value!r}")
        if f.choices is not None and value not in f.choices:
            raise ConfigError(f"config field '{path}': must be one of {list(f.choices)}, got {value!r}")
    elif k == "list":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config field '{path}': expected a list ({what}), got {value!r}")
        item = Field(f.item, doc=f.doc)
        value = _coerce_all([(f"{path}[{i}]", v, item) for i, v in enumerate(value)])
    elif k == "matrix":
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(r, (list, tuple)) for r in value)):
            raise ConfigError(f"config field '{path}': expected a matrix as a list of rows ({what}), "
                              f"got {value!r}")
        flat = _coerce_all([(f"{path}[{i}][{j}]", x, Field("float"))
                            for i, r in enumerate(value) for j, x in enumerate(r)])
        it = iter(flat)
        value = [[next(it) for _ in r] for r in value]
        if len({len(r) for r in value}) != 1:
            raise ConfigError(f"config field '{path}': rows of different lengths")
    elif k == "section":
        if not isinstance(value, Mapping):
            raise ConfigError(f"config field '{path}': expected a mapping ({what}), got {value!r}")
        if f.schema is not None:
            value = validate_section(path, value, f.schema)
        else:
            value = dict(value)
    else:  # pragma: no cover - programming error
        raise AssertionError(k)
    if f.check is not None:
        msg = f.check(value)
        if msg:
            raise ConfigError(f"config field '{path}': {msg}, got {value!r}")
    return value


def _coerce_all(items) -> list:
    """:func:`_coerce` of each ``(path, value, field)``; every failure named in one error."""
    out, problems = [], []
    for path, value, f in items:
        try:
            out.append(_coerce(path, value, f))
        except ConfigError as e:
            problems += _problems(e)
    if problems:
        raise ConfigError(_joined(problems), problems)
    return out


def validate_section(path: str, raw: Mapping, schema: Mapping[str, Field]) -> dict:
    """Validate a mapping against a schema: unknown fields, types, ranges, defaults.

    Args:
      path: the section's dotted path ("" at the top level), for messages.
      raw: the mapping to validate.
      schema: field name → :class:`Field`.

    Returns:
      The validated mapping, every field of the schema present (defaults filled).

    Raises:
      ConfigError: unknown, empty, missing or invalid fields, every one of them named in one
        error (an unknown field with the closest known names; at the top level of a config
        whose ``kind`` is a string, where every field is listed: ``jaxdyn kinds KIND``).
    """
    out, problems = {}, []
    prefix = f"{path}." if path else ""
    problems += [_unknown_field(f"{prefix}{key}", key, schema) for key in raw if key not in schema]
    for key, f in schema.items():
        try:
            out[key] = _field_value(prefix + key, raw, key, f)
        except ConfigError as e:
            problems += _problems(e)
    kind = raw.get("kind") if not path else None
    hint = ""
    if isinstance(kind, str) and any(p.startswith("unknown config field") for p in problems):
        hint = (f"every field of kind '{kind}': `jaxdyn kinds {kind}` "
                "(or docs/guides/config-reference.md)")
    if problems:
        raise ConfigError(_joined(problems, hint), problems)
    return out


def _field_value(name: str, raw: Mapping, key: str, f: Field):
    """The validated value of field ``key`` of ``raw`` (its default where it is not given)."""
    if (key in raw and raw[key] is None and f.kind in ("int", "float", "str", "bool")
            and f.default is not None and f.default is not REQUIRED):
        # `t1:` with no value read as "the default" silently (a field left empty by mistake)
        raise ConfigError(f"config field '{name}' is empty; give a value ({f.doc or f.kind}) "
                          f"or remove the line for the default {f.default!r}")
    if key in raw and raw[key] is not None:
        return _coerce(name, raw[key], f)
    if f.default is REQUIRED:
        raise ConfigError(f"config field '{name}' is required ({f.doc or f.kind})")
    d = copy.deepcopy(f.default)
    if f.kind == "section" and f.schema is not None:
        d = validate_section(name, d or {}, f.schema)
    return d


def validate_sweep(raw: Mapping, schema: Mapping[str, Field]) -> dict:
    """Validate ``sweep: {field: [values…]}`` over sweepable top-level fields.

    A field's values may also be given as ``{range: …}``, ``{linspace: …}`` or ``{logspace: …}``
    (:func:`_expand_grid`).

    Args:
      raw: the ``sweep`` mapping.
      schema: the kind's fields.

    Returns:
      Field → its validated, distinct values.

    Raises:
      ConfigError: not a mapping, a field that cannot be swept, an empty list, invalid or
        repeated values (every one named, in one error).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config field 'sweep': expected a mapping field -> list of values, got {raw!r}")
    out, problems = {}, []
    for key, values in raw.items():
        try:
            out[key] = _sweep_values(key, values, schema)
        except ConfigError as e:
            problems += _problems(e)
    if problems:
        raise ConfigError(_joined(problems), problems)
    return out


def _sweep_values(key, values, schema: Mapping[str, Field]) -> list:
    """The validated values of ``sweep.KEY`` (:func:`validate_sweep`)."""
    if key not in schema or not schema[key].sweepable:
        sweepable = sorted(k for k, f in schema.items() if f.sweepable)
        why = f" ({schema[key].doc})" if key in schema and schema[key].doc else ""
        raise ConfigError(f"config field 'sweep.{key}': cannot sweep over '{key}'{why}; "
                          f"sweepable fields: {', '.join(sweepable)}")
    if isinstance(values, Mapping):
        values = _expand_grid(f"sweep.{key}", values)
    if not isinstance(values, (list, tuple)) or len(values) == 0:
        raise ConfigError(f"config field 'sweep.{key}': expected a non-empty list of values, got {values!r}")
    vals = _coerce_all([(f"sweep.{key}[{i}]", v, schema[key]) for i, v in enumerate(values)])
    if len(set(map(_freeze, vals))) != len(vals):
        raise ConfigError(f"config field 'sweep.{key}': values must be distinct, got {values!r}")
    return vals


GRID_FORMS = ("range", "linspace", "logspace")


def _expand_grid(name, spec: Mapping) -> list:
    """Expand a grid form into a list of values.

    ``{range: [start, stop]}`` / ``{range: [start, stop, step]}`` (integers, stop excluded, as
    Python's range), ``{linspace: [start, stop, num]}``, ``{logspace: [start, stop, num]}`` (num
    values from start to stop inclusive, evenly or geometrically spaced).

    Args:
      name: the field's path, for messages.
      spec: the one-key mapping.

    Returns:
      The values.

    Raises:
      ConfigError: not one of the forms, or bad arguments (named).
    """
    import numpy as np

    if len(spec) != 1 or next(iter(spec)) not in GRID_FORMS:
        raise ConfigError(f"config field '{name}': expected a list of values or one of "
                          f"{{range: [start, stop(, step)]}}, {{linspace: [start, stop, num]}}, "
                          f"{{logspace: [start, stop, num]}}; got {dict(spec)!r}")
    form, args = next(iter(spec.items()))
    if not isinstance(args, (list, tuple)) or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        raise ConfigError(f"config field '{name}.{form}': expected a list of numbers, got {args!r}")
    if form == "range":
        if len(args) not in (2, 3) or not all(isinstance(a, int) for a in args) or (
                len(args) == 3 and args[2] == 0):
            raise ConfigError(f"config field '{name}.range': expected [start, stop] or "
                              f"[start, stop, step] integers with step != 0, got {args!r}")
        return list(range(*args))
    if len(args) != 3 or not isinstance(args[2], int) or args[2] < 1:
        raise ConfigError(f"config field '{name}.{form}': expected [start, stop, num] with an "
                          f"integer num >= 1, got {args!r}")
    start, stop, num = float(args[0]), float(args[1]), int(args[2])
    if form == "logspace":
        if start <= 0 or stop <= 0:
            raise ConfigError(f"config field '{name}.logspace': start and stop must be > 0, "
                              f"got {args!r}")
        return [float(v) for v in np.geomspace(start, stop, num)]
    return [float(v) for v in np.linspace(start, stop, num)]


def _freeze(v):
    return json.dumps(v, sort_keys=True)


def load_yaml(path) -> dict:
    """Read a YAML config file.

    Args:
      path: the file.

    Returns:
      The raw config (a mapping).

    Raises:
      ConfigError: no such file, not a file, unreadable, not UTF-8, not YAML or not a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    data = parse_yaml(text, f"config file {path}")
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return dict(data)


def default_config_text() -> str:
    """The embedded default experiment (``jaxdyn run`` with no CONFIG)."""
    return resources.files("jaxdyn").joinpath("defaults/default.yaml").read_text()


def default_config() -> dict:
    """The embedded default experiment, parsed.

    Returns:
      The raw config.
    """
    return parse_yaml(default_config_text(), "the embedded default config")


def config_hash(cfg: Mapping) -> str:
    """A stable hash of a resolved config (resume refuses a different config).

    Args:
      cfg: a resolved config (its ``name`` does not count).

    Returns:
      16 hex digits.
    """
    keep = {k: v for k, v in cfg.items() if k not in ("name",)}
    return hashlib.sha256(_freeze(keep).encode()).hexdigest()[:16]


def apply_overrides(raw: dict, overrides) -> dict:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config.

    Args:
      raw: the raw config (not modified).
      overrides: ``KEY=VALUE`` strings.

    Returns:
      A new raw config.

    Raises:
      ConfigError: a malformed override, or one into a field that is not a section.
    """
    raw = copy.deepcopy(raw)
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE (e.g. n=512 or sweep.beta=[1,10])")
        key, val = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r}: empty field name in {key!r}")
        node = raw
        for p in parts[:-1]:
            if node.get(p) is None:  # absent, or left empty in the YAML (`sweep:`)
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{p}' is not a section")
        node[parts[-1]] = parse_yaml(val, f"override {item!r}")
    return raw
