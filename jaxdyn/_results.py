"""One status vocabulary for every driver: :class:`RESULTS`, the :class:`Solution` base, and
helpers that read a status per member of a (batched) result.

``RESULTS`` extends ``diffrax.RESULTS`` (an ``equinox.Enumeration``), so diffrax's own codes
(``successful``, ``max_steps_reached``, ``dt_min_reached``, ...) pass through unchanged via
``RESULTS.promote(sol.result)``, and adds the outcomes of jaxdyn's drivers, each with a
message that says what happened and what to try.

Every driver returns a pytree built on :class:`Solution`: a ``result`` (a ``RESULTS`` item
whose value is an int array of any batch shape: one code per member under ``vmap``) and
``stats`` (a dict of arrays). On any such result

    sol.status    # int array of codes (compare with int(RESULTS.<name>._value) or MomentStatus)
    sol.ok        # bool array: successful
    sol.messages  # str (one member) or array of str, one per member (concrete results)
    sol.names     # the same with the code names ("successful", "blowup", ...)

and :func:`status_codes`, :func:`status_messages`, :func:`status_names`,
:func:`is_successful` do the same on a bare ``result``. None of them raises on a batched
result. Drivers take ``throw=`` (default False): with ``throw=True`` an unsuccessful
result raises with its message (``eqx.error_if`` under ``jit``, a ``RuntimeError`` naming
the first failed member otherwise).
"""

from __future__ import annotations

import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["RESULTS", "Solution", "status_codes", "status_messages", "status_names",
           "is_successful", "from_codes", "code", "raise_if_failed", "error_if_failed"]

with warnings.catch_warnings():
    # ``nonfinite`` exists upstream (optimistix); its message is replaced on purpose by one
    # that says what to try in an ODE/particle run.
    warnings.simplefilter("ignore")

    class RESULTS(diffrax.RESULTS):  # pyright: ignore[reportGeneralTypeIssues]
        nonfinite = (
            "Non-finite values (NaN or inf) appeared in the solution. Try a smaller step "
            "(dt) or tighter tolerances, float64 (jax_enable_x64), and check the inputs and "
            "parameters for NaN/inf.")
        blowup = (
            "Finite-time blow-up: the covariance norm passed the blow-up threshold on a pole "
            "(quadratic growth dominates). This is the dynamics, not a solver failure: the "
            "refined blow-up time is in `blowup_time`; the state is reported at the detection "
            "time.")
        large = (
            "The covariance norm passed the blow-up threshold without the pole signature (or "
            "on a pole whose refined blow-up time lies after t1), so no finite-time blow-up "
            "before t1 is claimed (`blowup_time` is inf) and the solve stopped there. Try a "
            "larger `blowup_threshold` to follow the growth further.")
        invalid_input = (
            "Invalid input (e.g. a non-finite initial state, rows off the sphere, or an S0 "
            "that is not a symmetric PSD covariance), flagged rather than raised because the "
            "check ran under jit/vmap. Call the driver on concrete inputs to get the "
            "ValueError that names the defect.")
        stiff = (
            "The member turned stiff and the batched solver's stiff stage was switched off "
            "(`stiff=False`); it stopped at `t_final`. Run with `stiff=True` (Rodas5 stage).")
        not_converged = (
            "The iterative solve did not meet its tolerance (Sinkhorn marginals, or reach's "
            "W2 target). Try more iterations (`max_iterations`, `max_rounds`, `steps`), a "
            "larger epsilon or a looser tolerance; the value returned is the last iterate.")


def code(item) -> int:
    """The int code of one concrete ``RESULTS`` member, e.g. ``code(RESULTS.blowup)``."""
    return int(np.asarray(_promote(item)._value))


def _promote(result):
    if isinstance(getattr(result, "result", None), eqx.Module):  # a result object
        result = result.result
    if isinstance(result, (int, np.integer)) or (
            isinstance(result, (np.ndarray, jax.Array)) and jnp.issubdtype(result.dtype, jnp.integer)):
        return from_codes(np.asarray(result) if isinstance(result, (int, np.integer)) else result)
    if not hasattr(result, "_enumeration"):
        raise TypeError(f"expected a jaxdyn.RESULTS item or a result object, got {result!r}")
    if result._enumeration is RESULTS:
        return result
    return RESULTS.promote(result)


def from_codes(codes):
    """A ``RESULTS`` item holding an int array of codes (any shape, one per member)."""
    if isinstance(codes, np.ndarray):  # host results (numpy fields) keep numpy codes
        codes = codes.astype(np.int32)
    else:
        codes = jnp.asarray(codes, jnp.int32)
    return eqx.tree_at(lambda r: r._value, RESULTS.successful, codes)


def status_codes(result):
    """Int array of status codes (any batch shape) of a ``RESULTS`` item, a diffrax result
    (promoted), a result object, or stored integer codes (e.g. a ``status`` variable read
    back from a results file). Works under jit/vmap (then it is traced)."""
    value = _promote(result)._value
    return value if isinstance(value, np.ndarray) else jnp.asarray(value)


def is_successful(result):
    """Bool array: which members are ``RESULTS.successful``."""
    return status_codes(result) == code(RESULTS.successful)


_NAMES = {code(item): name for name, item in RESULTS._name_to_item.items()}


def _per_member(result, fn):
    codes = status_codes(result)
    if isinstance(codes, jax.core.Tracer):
        raise ValueError("status messages need a concrete result (not under jit/vmap); "
                         "return the result and read them outside")
    codes = np.asarray(codes)
    if codes.ndim == 0:
        return fn(int(codes))
    out = np.empty(codes.shape, dtype=object)
    for i, c in np.ndenumerate(codes):
        out[i] = fn(int(c))
    return out


def status_names(result):
    """The code name (``"successful"``, ``"blowup"``, ``"max_steps_reached"``, ...) of each
    member: a ``str`` for one member, an object array of ``str`` for a batch."""
    return _per_member(result, lambda c: _NAMES[c])


def status_messages(result):
    """The message of each member's status (the name for ``successful``, whose message is
    empty): a ``str`` for one member, an object array of ``str`` for a batch."""
    return _per_member(result, lambda c: RESULTS._index_to_message[c] or _NAMES[c])


def raise_if_failed(result, what: str = "solve"):
    """Raise ``RuntimeError`` (naming the first failed member and its message) if any member
    of a concrete result is not successful; returns None otherwise."""
    codes = np.asarray(status_codes(result))
    bad = codes != code(RESULTS.successful)
    if not np.any(bad):
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if codes.ndim else ()
    c = int(codes[first]) if first else int(codes)
    where = f" (member {first[0] if len(first) == 1 else first}; {int(bad.sum())} of {bad.size} " \
            "failed)" if first else ""
    raise RuntimeError(f"{what} failed{where}: {_NAMES[c]}: "
                       f"{RESULTS._index_to_message[c]}")


def error_if_failed(token, result):
    """``eqx.error_if`` on ``token`` with the result's message when it is not successful
    (works under jit/vmap: the error is raised at run time)."""
    result = _promote(result)
    return result.error_if(token, result != RESULTS.successful)


def stat(name: str, doc: str = ""):
    """A read-only property of a result class that reads ``self.stats[name]``."""
    return property(lambda self: self.stats[name], doc=doc or f"``stats[{name!r}]``.")


class Solution(eqx.Module):
    """Base of every driver's result: a pytree with ``result`` (:class:`RESULTS`, one code
    per member) and ``stats`` (a dict of arrays: step counts, iterations, timings). Drivers
    that integrate in time also carry ``ts`` and their states under their own names."""

    result: eqx.AbstractVar[RESULTS]
    stats: eqx.AbstractVar[dict]

    # each reads the members' codes through the helper of the same meaning
    status = property(lambda self: status_codes(self.result),
                      doc="Int array of status codes (any batch shape; never raises on a batch).")
    ok = property(lambda self: is_successful(self.result),
                  doc="Bool array: which members are successful.")
    messages = property(lambda self: status_messages(self.result),
                        doc="Each member's status message (str, or an object array for a batch).")
    names = property(lambda self: status_names(self.result),
                     doc="Each member's status name (str, or an object array for a batch).")

    def counts(self) -> dict:
        """Number of members per status name (names with no member left out)."""
        codes = np.asarray(self.status).reshape(-1)
        return {_NAMES[int(c)]: int(n) for c, n in zip(*np.unique(codes, return_counts=True))}
