"""One status vocabulary for every driver: :class:`RESULTS` and the :class:`Solution` base.

With helpers that read a status per member of a (batched) result.

``RESULTS`` extends ``diffrax.RESULTS`` (an ``equinox.Enumeration``), so diffrax's own codes
(``successful``, ``max_steps_reached``, ``dt_min_reached``, ...) pass through unchanged via
``RESULTS.promote(sol.result)``, and adds the outcomes of jaxdyn's drivers, each with a
message that says what happened and what to try. Every message begins with its code's name, so
that a printed result names its status: ``print(sol.result)`` shows
``RESULTS<max_steps_reached: The maximum number of solver steps was reached. ...>``.

Every driver returns a pytree built on :class:`Solution`: a ``result`` (a ``RESULTS`` item
whose value is an int array of any batch shape: one code per member under ``vmap``) and
``stats`` (a dict of arrays). On any such result

    sol.status    # int array of codes (compare with status_code("blowup"), ...)
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

__all__ = ["RESULTS", "STATUS_NAMES", "Solution", "status_code", "status_codes", "status_messages", "status_names",
           "is_successful", "from_codes", "code", "raise_if_failed", "error_if_failed"]

#: the codes jaxdyn's RESULTS takes from diffrax (and the optimistix/lineax codes it extends)
_LIBRARY_CODES = ("max_steps_reached", "singular", "breakdown", "stagnation", "conlim",
                  "nonfinite_input", "nonlinear_max_steps_reached", "nonlinear_divergence",
                  "dt_min_reached", "event_occurred", "max_steps_rejected", "internal_error")


def _named(name: str) -> str:
    """The message diffrax gives the code ``name``, led by the name (``"max_steps_reached: ..."``)."""
    item = getattr(diffrax.RESULTS, name, None)
    return f"{name}: {diffrax.RESULTS[item] if item is not None else name.replace('_', ' ')}"


with warnings.catch_warnings():
    # Every message is led by its code's name, so that a printed result names its status
    # (``print(sol.result)`` shows ``RESULTS<blowup: Finite-time blow-up: ...>``; equinox's
    # repr of a code shows its message, and diffrax's ``successful`` has none). The codes of
    # diffrax (optimistix, lineax) keep their values and their messages after the name; the
    # warning equinox gives for a message replaced on purpose is silenced.
    warnings.simplefilter("ignore")

    class RESULTS(diffrax.RESULTS):  # pyright: ignore[reportGeneralTypeIssues]
        successful = "successful: the solve finished with no failure."
        # diffrax's (optimistix's, lineax's) codes, each message led by its name
        locals().update({n: _named(n) for n in _LIBRARY_CODES})
        nonfinite = (
            "nonfinite: Non-finite values (NaN or inf) appeared in the solution. Try a smaller step "
            "(dt) or tighter tolerances, float64 (jax_enable_x64), and check the inputs and "
            "parameters for NaN/inf.")
        blowup = (
            "blowup: Finite-time blow-up: the covariance norm passed the blow-up threshold on a pole "
            "(quadratic growth dominates). This is the dynamics, not a solver failure: the "
            "refined blow-up time is in `blowup_time`; the state is reported at the detection "
            "time.")
        large = (
            "large: The covariance norm passed the blow-up threshold without the pole signature (or "
            "on a pole whose refined blow-up time lies after t1), so no finite-time blow-up "
            "before t1 is claimed (`blowup_time` is inf) and the solve stopped there. Try a "
            "larger `blowup_threshold` to follow the growth further.")
        invalid_input = (
            "invalid_input: Invalid input (e.g. a non-finite initial state, rows off the sphere, or an S0 "
            "that is not a symmetric PSD covariance), flagged rather than raised because the "
            "check ran under jit/vmap. Call the driver on concrete inputs to get the "
            "ValueError that names the defect.")
        stiff = (
            "stiff: The member turned stiff and the batched solver's stiff stage was switched off "
            "(`stiff=False`); it stopped at `t_final`. Run with `stiff=True` (Rodas5 stage).")
        not_converged = (
            "not_converged: The iterative solve did not meet its tolerance (Sinkhorn marginals, or reach's "
            "W2 target). Try more iterations (`max_iterations`, `max_rounds`, `steps`), a "
            "larger epsilon or a looser tolerance; the value returned is the last iterate.")


#: The status names in code order: an int code is its name's index here (the codes stored in
#: results files). diffrax's (and optimistix's, lineax's) codes first, then jaxdyn's. Each
#: name is looked up on ``RESULTS`` through the public enumeration interface; a name that a
#: later diffrax drops is left out.
STATUS_NAMES = tuple(n for n in (
    "successful", "max_steps_reached", "singular", "breakdown", "stagnation", "conlim",
    "nonfinite_input", "nonlinear_max_steps_reached", "nonlinear_divergence", "nonfinite",
    "dt_min_reached", "event_occurred", "max_steps_rejected", "internal_error",
    "blowup", "large", "invalid_input", "stiff", "not_converged") if hasattr(RESULTS, n))
_MEMBERS = tuple(getattr(RESULTS, n) for n in STATUS_NAMES)
_NAMES = dict(enumerate(STATUS_NAMES))
#: each code's message (``RESULTS[item]``: equinox's public lookup)
_MESSAGES = {k: str(RESULTS[m]) for k, m in enumerate(_MEMBERS)}


def _promote(result):
    if isinstance(getattr(result, "result", None), eqx.Module):  # a result object
        result = result.result
    if isinstance(result, (int, np.integer)) or (
            isinstance(result, (np.ndarray, jax.Array)) and jnp.issubdtype(result.dtype, jnp.integer)):
        return from_codes(result)
    if isinstance(result, RESULTS):
        return result
    if not isinstance(result, eqx.Module):
        raise TypeError(f"expected a jaxdyn.RESULTS item or a result object, got {result!r}")
    return RESULTS.promote(result)


def from_codes(codes):
    """A ``RESULTS`` item from int codes; works under jit/vmap.

    Args:
        codes: int codes of any shape, one per member (the index in :data:`STATUS_NAMES`).

    Returns:
        The ``RESULTS`` item with one code per member, of the shape of ``codes``.
    """
    codes = jnp.asarray(codes, jnp.int32)

    def one(c):  # equinox's ``where`` takes a scalar predicate: one member at a time
        out = _MEMBERS[0]
        for k, member in enumerate(_MEMBERS[1:], start=1):
            out = RESULTS.where(c == k, member, out)
        return out

    if codes.ndim == 0:
        return one(codes)
    flat = jax.vmap(one)(codes.reshape(-1))
    return jax.tree.map(lambda v: v.reshape(codes.shape), flat)


def status_codes(result):
    """Int array of status codes, one per member; works under jit/vmap (then it is traced).

    Args:
        result: a ``RESULTS`` item, a diffrax result (promoted), a result object, or stored
            integer codes (e.g. a ``status`` variable read back from a results file).

    Returns:
        An int32 array of the result's batch shape.
    """
    if isinstance(getattr(result, "result", None), eqx.Module):
        result = result.result
    if isinstance(result, (int, np.integer)) or (
            isinstance(result, (np.ndarray, jax.Array)) and jnp.issubdtype(result.dtype, jnp.integer)):
        return jnp.asarray(result, jnp.int32)
    item = _promote(result)
    codes = jnp.zeros(jnp.shape(item == _MEMBERS[0]), jnp.int32)
    for k, member in enumerate(_MEMBERS[1:], start=1):
        codes = jnp.where(item == member, jnp.int32(k), codes)
    return codes


def code(item) -> int:
    """The int code of one concrete ``RESULTS`` member, e.g. ``code(RESULTS.blowup)``.

    Args:
        item: one concrete ``RESULTS`` member.

    Returns:
        Its int code (its index in :data:`STATUS_NAMES`).
    """
    with jax.ensure_compile_time_eval():  # a constant, also while a jit traces
        return int(np.asarray(status_codes(item)))


def status_code(status) -> int:
    """The int code of one status, for comparisons with ``sol.status`` and stored codes.

    Args:
        status: a ``RESULTS`` member (``RESULTS.blowup``) or its name (``"blowup"``).

    Returns:
        The member's int code, e.g. ``sol.status == jaxdyn.status_code("blowup")``.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(status, str):
        if status not in STATUS_NAMES:
            raise ValueError(f"unknown status {status!r}; known: {list(STATUS_NAMES)}")
        return STATUS_NAMES.index(status)
    return code(status)


def is_successful(result):
    """Which members are ``RESULTS.successful``.

    Args:
        result: anything :func:`status_codes` takes.

    Returns:
        A bool array of the result's batch shape.
    """
    return status_codes(result) == 0


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
    """The code name (``"successful"``, ``"blowup"``, ...) of each member.

    Args:
        result: a concrete result (anything :func:`status_codes` takes, not traced).

    Returns:
        A ``str`` for one member, an object array of ``str`` for a batch (a traced result,
        under jit/vmap, is a ``ValueError``).
    """
    return _per_member(result, lambda c: _NAMES[c])


def status_messages(result):
    """The message of each member's status (what happened and what to try).

    Args:
        result: as for :func:`status_names`.

    Returns:
        The messages, shaped as :func:`status_names`' names.
    """
    return _per_member(result, lambda c: _MESSAGES[c])


def raise_if_failed(result, what: str = "solve"):
    """Raise if any member of a concrete result is not successful.

    Args:
        result: a concrete result (anything :func:`status_codes` takes).
        what: the name of the computation, used in the message.

    Raises:
        RuntimeError: naming the first failed member, its status and its message.
    """
    codes = np.asarray(status_codes(result))
    bad = codes != 0
    if not np.any(bad):
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if codes.ndim else ()
    c = int(codes[first]) if first else int(codes)
    where = f" (member {first[0] if len(first) == 1 else first}; {int(bad.sum())} of {bad.size} " \
            "failed)" if first else ""
    raise RuntimeError(f"{what} failed{where}: {_MESSAGES[c]}")  # the message names the status


def error_if_failed(token, result):
    """``eqx.error_if`` on ``token`` with the result's message when it is not successful.

    Works under jit/vmap: the error is raised at run time.

    Args:
        token: the array the check is attached to (returned unchanged when successful).
        result: the result to check.

    Returns:
        ``token``, carrying the run-time check.
    """
    result = _promote(result)
    return result.error_if(token, result != RESULTS.successful)


def stat(name: str, doc: str = ""):
    """A read-only property of a result class that reads ``self.stats[name]``.

    Args:
        name: the key in ``stats``.
        doc: the property's docstring (default: the key).

    Returns:
        The ``property``.
    """
    return property(lambda self: self.stats[name], doc=doc or f"``stats[{name!r}]``.")


class Solution(eqx.Module):
    """Base of every driver's result: a pytree with a status per member and statistics.

    Drivers that integrate in time also carry ``ts`` and their states under their own names.

    Attributes:
        result: a :class:`RESULTS` item, one code per member.
        stats: a dict of arrays (step counts, iterations, timings).
    """

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
        """Number of members per status name (names with no member left out).

        Returns:
            A dict from status name to member count.
        """
        codes = np.asarray(self.status).reshape(-1)
        return {_NAMES[int(c)]: int(n) for c, n in zip(*np.unique(codes, return_counts=True))}
