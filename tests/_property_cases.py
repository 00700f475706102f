"""The cases and the judge of the property-based fault suite (tests/test_properties.py).

A :class:`Case` is one public function with a way to build valid unit-scale inputs of a given
size (N points in dimension d), the call, the arrays that faults are put into, and what its
output is read as (the arrays checked, the status codes if it has a status). :func:`run`
applies a :data:`FAULTS` entry (a special value, a scale, an empty shape, a dtype) to one
input, calls the function concretely, under ``jax.jit`` or under ``jax.vmap`` (a batch of the
valid input and the faulted one), and :func:`judge` accepts one of three outcomes:

* a named error before compute: a ``ValueError`` or ``TypeError`` whose message names a
  parameter of the function (or the function itself);
* a flagged output: a status that is not ``successful`` when any checked output is not
  finite (or when the input was not finite); for a bare-array function (no status channel) the
  flag is NaN (−1 in integer outputs), as ``tests/test_traced_domains.py`` states;
* a finite output equal to a reference: the float64 concrete call at unit scale carried
  through the case's scale law (``W2(s x, s y) = s W2(x, y)``), else the float64 concrete call
  on the same (rounded) input.

Anything else fails: another exception type (``IndexError``, ``ZeroDivisionError``, a runtime
error from deep inside a library), an error whose message names no parameter, a non-finite
output reported ``successful``, a finite output from a non-finite input, a finite output that
disagrees with the reference.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

import jaxdyn

#: value faults (vmap-able: they keep the input's shape and dtype)
VALUE_FAULTS = ("none", "nan", "posinf", "neginf", "zero", "negative", "huge", "tiny",
                "subnormal")
#: shape and dtype faults (concrete or jit only)
SHAPE_FAULTS = ("empty", "d0")
DTYPE_FAULTS = ("int32", "float16", "bfloat16", "complex64")
FAULTS = VALUE_FAULTS + SHAPE_FAULTS + DTYPE_FAULTS
MODES = ("concrete", "jit", "vmap")
NONFINITE_FAULTS = ("nan", "posinf", "neginf")
SCALES = ("huge", "tiny")


def scale_of(case, fault: str, dtype) -> float:
    """The factor of a huge/tiny fault: 1e±30, less where an input scaled by its power would
    leave the dtype's normal range (float32 covariances: 1e±16)."""
    p = max((abs(v) for v in (case.scale or {}).values()), default=1)
    e = min(30, int(np.log10(float(np.finfo(dtype).max)) / p) - 3)
    return 10.0 ** (e if fault == "huge" else -e)


@dataclasses.dataclass(frozen=True)
class Case:
    """One public function under the fault suite.

    Attributes:
        name: the public name (the coverage walk matches it against ``__all__``).
        build: ``(n, d) -> {arg: float64 array}``: valid inputs at unit scale.
        call: ``(**arrays) -> output``.
        targets: the arrays a fault may go into.
        read: ``output -> (checked arrays (a pytree), status codes or None)``.
        scale: ``{arg: power}``: the arrays scaled together by ``s**power`` for a huge/tiny
            fault, and ``out_power``: the checked outputs then scale by ``s**out_power``
            (None: no scale law; the reference is the float64 call on the scaled input).
        out_power: see ``scale``.
        host: runs on the host only: under jit/vmap a named TypeError is the answer.
        rtol: relative tolerances (float32, float64) against the reference.
        atol: absolute tolerances (float32, float64), times the reference's largest magnitude
            (at least 1 unscaled). Float32's 1e-6 (8 ulps at the outputs' size): the float32
            input is the float64 one rounded (a relative 6e-8 an entry) while the reference
            takes the unrounded one, so an output that cancels to near zero (a mode
            amplitude of points evenly spread, of order 1e-8 from the rounding of the
            points alone) differs from it by some ulps of its size, whatever the function
            does; 1e-12 asks that of float64 only.
        sizes: the (n, d) the long profile draws from (the default uses the first).
        has_n: the inputs have a point axis (an "empty" fault builds n = 0).
        has_d: the inputs have a dimension (a "d0" fault builds d = 0).
        modes: the modes that apply.
        faults: the faults that apply (default: all).
        masks: ``(fault, target)`` pairs that are documented inputs, not faults (``pot =
            −inf`` of blocked_lse: a masked key): judged as a valid input against the float64
            reference on the same input (a flag only where that reference is flagged too).
    """

    name: str
    build: Callable[[int, int], dict]
    call: Callable[..., Any]
    targets: tuple
    read: Callable[[Any], tuple] = None
    scale: Optional[dict] = None
    out_power: float = 1.0
    host: bool = False
    rtol: tuple = (1e-4, 1e-9)
    atol: tuple = (1e-6, 1e-12)
    sizes: tuple = ((3, 2), (1, 1), (8, 3))
    has_n: bool = True
    has_d: bool = True
    modes: tuple = MODES
    faults: tuple = FAULTS
    fn: Any = None  # the public function (for its parameter names)
    heavy: bool = False  # the default profile calls it concretely in float64 only (its
    #                      faulted inputs then reuse the reference's compiled program)
    same_dtype_reference: bool = False  # the reference runs in the input's dtype (a
    #                                     computation whose float32 path differs by design,
    #                                     e.g. random numbers drawn in the dtype)
    valid_statuses: tuple = ("successful",)  # statuses a valid unit-scale input may end in
    names: tuple = ()  # further names a named error may mention (a function it dispatches to)
    masks: tuple = ()

    def params(self) -> set:
        """Names a named error may mention: the function's parameters and its name."""
        names = {self.name, *self.names} | set(self.build(1, 1))
        if self.fn is not None:
            try:
                names |= set(inspect.signature(self.fn).parameters)
            except (TypeError, ValueError):
                pass
        return names


# ------------------------------------------------------------------------------ inputs


def _cast(a, dtype):
    if np.dtype(dtype) == np.complex64:
        return jnp.asarray(np.asarray(a) * (1 + 0.5j), jnp.complex64)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return jnp.asarray(np.round(np.asarray(a) * 4), dtype)
    return jnp.asarray(a, dtype)


def faulted_inputs(case: Case, fault: str, target: str, n: int, d: int, dtype):
    """``(inputs, base)``: the faulted inputs and the valid ones, both in ``dtype`` (the dtype
    faults change only the target's dtype; ``base`` is None for shape/dtype faults)."""
    if fault == "empty":
        raw = case.build(0, d)
    elif fault == "d0":
        raw = case.build(n, 0)
    else:
        raw = case.build(n, d)
    base = {k: jnp.asarray(v, dtype) for k, v in raw.items()}
    if fault in SHAPE_FAULTS:
        return base, None
    if fault in DTYPE_FAULTS:
        out = dict(base)
        out[target] = _cast(raw[target], jnp.bfloat16 if fault == "bfloat16" else fault)
        return out, None
    out = dict(base)
    a = np.array(raw[target], np.float64)
    if fault in NONFINITE_FAULTS:
        if a.size:
            a.flat[a.size // 2] = {"nan": np.nan, "posinf": np.inf, "neginf": -np.inf}[fault]
    elif fault == "zero":
        a = np.zeros_like(a)
    elif fault == "negative":
        a = -a
    elif fault == "subnormal":
        if a.size:
            a.flat[a.size // 2] = float(np.finfo(dtype).smallest_subnormal)
    elif fault in SCALES:
        s = scale_of(case, fault, dtype)
        if case.scale is not None:
            for k, p in case.scale.items():
                out[k] = jnp.asarray(np.asarray(raw[k], np.float64) * s ** p, dtype)
            return out, base
        a = a * s
    out[target] = jnp.asarray(a, dtype)
    return out, base


# ------------------------------------------------------------------------------ calls


class Named(Exception):
    """The call raised a named error (the outcome "a named error before compute")."""


_TRANSFORMED = {}


def _transformed(case: Case, mode: str):
    """``jax.jit`` / ``jax.vmap`` of the case's call, one per case (so that an input of a shape
    and dtype seen before reuses its compiled program)."""
    key = (case.name, id(case.call), mode)
    if key not in _TRANSFORMED:
        fn = lambda kw: case.call(**kw)  # noqa: E731
        _TRANSFORMED[key] = jax.jit(fn) if mode == "jit" else jax.jit(jax.vmap(fn))
    return _TRANSFORMED[key]


def _call(case: Case, inputs: dict, mode: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "concrete":
            return case.call(**inputs)
        return _transformed(case, "jit")(inputs)


def _vmap_call(case: Case, lanes: list):
    batched = jax.tree.map(lambda *a: jnp.stack(a), *lanes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _transformed(case, "vmap")(batched)


def _named(case: Case, e: BaseException) -> bool:
    if type(e) not in (ValueError, TypeError) and not (
            isinstance(e, (ValueError, TypeError)) and type(e).__module__.startswith("jaxdyn")):
        return False
    msg = str(e)
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_])", msg)
               for p in case.params())


def attempt(case: Case, thunk):
    """``("named", message)`` or ``("out", output)``; any other exception propagates (with the
    case's name), as does a ValueError/TypeError that names no parameter."""
    try:
        return "out", thunk()
    except (ValueError, TypeError) as e:
        if _named(case, e):
            return "named", str(e)
        raise AssertionError(f"{case.name}: {type(e).__name__} that names no parameter "
                             f"({sorted(case.params())}): {e}") from e


def _read(case: Case, out):
    if case.read is not None:
        return case.read(out)
    if isinstance(out, jaxdyn.Solution):
        return out, np.asarray(jaxdyn.status_codes(out.result))
    return out, None


def _leaves(tree):
    return [np.asarray(a) for a in jax.tree.leaves(tree)
            if hasattr(a, "dtype") or isinstance(a, (int, float, complex))]


def _inexact(a) -> bool:
    return jnp.issubdtype(a.dtype, jnp.inexact)  # (bfloat16 too, which NumPy does not know)


def _flagged(leaves) -> bool:
    """Some output entry is a flag: NaN/inf (inexact) or −1 (integers)."""
    for a in leaves:
        if a.dtype == bool:
            continue
        if _inexact(a):
            wide = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
            if a.size and not np.all(np.isfinite(wide)):
                return True
        elif np.issubdtype(a.dtype, np.integer) and np.any(a == -1):
            return True
    return False


def _lane(tree, i):
    return jax.tree.map(lambda a: a[i], tree)


# ------------------------------------------------------------------------------ the judge


def reference(case: Case, fault: str, target: str, n: int, d: int, dtype):
    """The float64 concrete reference for ``fault`` (checked arrays, status) or None when it
    has none (it raises, or it is flagged)."""
    if fault in SCALES and case.scale is not None:
        inputs, _ = faulted_inputs(case, "none", target, n, d, np.float64)
        power = scale_of(case, fault, dtype) ** case.out_power
    elif fault in SCALES + ("subnormal",) or case.same_dtype_reference:
        # no scale law: at 1e±30 a float32 computation meets overflow and underflow (ties
        # among logits that underflow) that float64 does not, and XLA flushes float32
        # subnormals to zero; the reference is the concrete call in the input's dtype (so
        # jit and vmap agree with it)
        inputs, _ = faulted_inputs(case, fault, target, n, d, dtype)
        power = 1.0
    elif fault in VALUE_FAULTS:
        # the unit-scale input itself, built in float64 (a float32 rounding of a unit row is
        # off the sphere at float64's tolerance)
        inputs, _ = faulted_inputs(case, fault, target, n, d, np.float64)
        power = 1.0
    else:
        got, _ = faulted_inputs(case, fault, target, n, d, dtype)
        # the same rounded values, in float64 (a complex input's reference is never read)
        inputs = {k: jnp.asarray(np.real(np.asarray(v.astype(jnp.float32) if v.dtype == jnp.bfloat16
                                                    else v)).astype(np.float64))
                  for k, v in got.items()}
        power = 1.0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = case.call(**inputs)
    except (ValueError, TypeError):
        return None
    checked, status = _read(case, out)
    if (status is not None and np.any(status != 0)) or _flagged(_leaves(checked)):
        return None
    return jax.tree.map(lambda a: np.asarray(a, np.float64) * power
                        if _inexact(np.asarray(a)) else np.asarray(a), checked)


def judge(case: Case, fault: str, out, ref, dtype, *, where: str, target: str = None):
    """Assert that one (unbatched) output is an allowed outcome; returns its class."""
    checked, status = _read(case, out)
    leaves = _leaves(checked)
    flagged = _flagged(leaves)
    masked = (fault, target) in case.masks
    # a masked input is a valid one: flagged only where its reference is
    assert not (masked and flagged and ref is not None), \
        f"{where}: a documented input ({fault} in {target}) flagged, its reference is finite"
    bad_input = fault in NONFINITE_FAULTS and not masked
    if status is not None:
        ok = bool(np.all(status == 0))
        assert not (ok and flagged), f"{where}: a non-finite output reported successful"
        assert not (ok and bad_input), f"{where}: a non-finite input gave a finite output " \
                                       "reported successful"
        if not ok:
            allowed = [jaxdyn.status_code(n) for n in case.valid_statuses]
            assert fault != "none" or (np.all(np.isin(status, allowed)) and not flagged), \
                f"{where}: valid unit-scale input flagged, status {status}"
            return "status"
    else:
        if flagged:
            assert fault != "none", f"{where}: valid unit-scale input gave NaN"
            return "nan"
        assert not bad_input, f"{where}: a non-finite input gave a finite output (no flag)"
    if fault == "complex64":
        # a finite real output from a complex input dropped its imaginary part
        assert any(np.iscomplexobj(a) for a in leaves), \
            f"{where}: a complex input gave a real output (its imaginary part dropped)"
        return "finite"
    half = fault in ("float16", "bfloat16")
    if ref is None and half:
        # the half-precision rounding of a valid input may leave the float64 domain (a row
        # off the sphere by 1e-3) while it meets the tolerance of its own dtype
        return "finite"
    if ref is None:
        raise AssertionError(f"{where}: a finite output where the float64 reference raises "
                             "or is flagged")
    r32, r64 = case.rtol
    # an integer input may be computed in float32 or float64 (the function's choice)
    f64 = np.dtype(dtype) == np.float64 and fault not in DTYPE_FAULTS
    rtol, atol = (r64, case.atol[1]) if f64 else (r32, case.atol[0])
    if half:  # a half-precision input may be computed in its dtype (3 digits for bfloat16)
        rtol, atol = max(rtol, 2e-2), max(atol, 2e-2)
    for got, want in zip(jax.tree.leaves(checked), jax.tree.leaves(ref)):
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"{where}: shape {got.shape}, reference {want.shape}"
        if _inexact(got):
            # absolute tolerance relative to the reference's size (its unit size unscaled)
            size = float(np.max(np.abs(want), initial=0.0))
            if fault not in SCALES:
                size = max(size, 1.0)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol,
                                       atol=atol * size, err_msg=where)
        else:
            np.testing.assert_array_equal(got, want, err_msg=where)
    return "finite"


def run(case: Case, fault: str, mode: str, dtype, n: int, d: int, target: str) -> str:
    """Run one example and judge it; returns the outcome class."""
    where = f"{case.name}[{fault} in {target}, {mode}, {np.dtype(dtype).name}, n={n}, d={d}]"
    inputs, base = faulted_inputs(case, fault, target, n, d, dtype)
    if case.host and mode != "concrete":
        kind, got = attempt(case, lambda: _call(case, inputs, "jit") if mode == "jit"
                            else _vmap_call(case, [inputs, inputs]))
        assert kind == "named", f"{where}: a host function ran under {mode}"
        return "named"
    if mode == "vmap":
        assert base is not None
        kind, got = attempt(case, lambda: _vmap_call(case, [base, inputs]))
        if kind == "named":
            return "named"
        ref0 = reference(case, "none", target, n, d, dtype)
        judge(case, "none", _lane(got, 0), ref0, dtype, where=where + " (valid lane)")
        out = _lane(got, 1)
    else:
        kind, got = attempt(case, lambda: _call(case, inputs, mode))
        if kind == "named":
            assert fault != "none" or mode != "concrete", f"{where}: valid input refused: {got}"
            return "named"
        out = got
    ref = reference(case, fault, target, n, d, dtype)
    return judge(case, fault, out, ref, dtype, where=where, target=target)
