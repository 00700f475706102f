r"""The Adam → L-BFGS driver shared by :func:`~jaxdyn.control.reach` and :func:`~jaxdyn.control.measure_control`.

Both optimisers run Adam (``optax.adam`` guarded by ``optax.apply_if_finite``: a non-finite
gradient leaves the iterate and Adam's moments as they were) and then L-BFGS (``optax.lbfgs``:
its two-loop recursion and its zoom line search) on the flat vector of their parameters. Each
phase advances inside jitted programs by segments of iterations (:func:`segment_loop`), and
:func:`drive` runs the segments from the host: between two of them Python handles a signal
(``KeyboardInterrupt`` stops the run within one segment's time) and a callback sees the
progress. The boundaries depend only on the segment length and the budgets, never on the
clock, so the values are the same however often a run is watched.

What each optimiser accepts, rejects and stops on (its line of the loss, its stop codes) is
its own: :mod:`jaxdyn.control._reach_loop` and :mod:`jaxdyn.control._measure`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array

# ``apply_if_finite``'s count of non-finite updates in a row before it gives up: never.
_ALWAYS = 2**30


def adam(learning_rate) -> optax.GradientTransformation:
    """Adam at ``learning_rate`` (a number or a schedule ``step -> rate``), skipping non-finite gradients.

    Args:
        learning_rate: a scalar or a callable of the step count.

    Returns:
        ``optax.apply_if_finite(optax.adam(learning_rate))``.
    """
    return optax.apply_if_finite(optax.adam(learning_rate), max_consecutive_errors=_ALWAYS)


def lbfgs() -> optax.GradientTransformationExtraArgs:
    """L-BFGS with optax's defaults: memory 10, the zoom line search (strong Wolfe)."""
    return optax.lbfgs()


def finite(tree) -> Array:
    """Whether every leaf of ``tree`` is finite (a boolean scalar)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def lbfgs_iteration(tx, x, state, value, grad, value_fn: Callable, **fn_kwargs):
    """One L-BFGS iteration at ``x``: the direction and its line search.

    Args:
        tx: the :func:`lbfgs` transformation.
        x: the iterate (a flat vector).
        state: its L-BFGS state.
        value: the loss at ``x``.
        grad: its gradient.
        value_fn: the loss the line search evaluates, ``value_fn(x, **fn_kwargs)``.
        **fn_kwargs: further arguments of ``value_fn``.

    Returns:
        ``(x_new, state_new, value_new, grad_new, trial_finite)``: the line search's point, the
        state after it, the loss and gradient there, and whether both are finite.
    """
    update, new = tx.update(grad, state, x, value=value, grad=grad, value_fn=value_fn,
                            **fn_kwargs)
    x_new = optax.apply_updates(x, update)
    v_new, g_new = optax.tree.get(new, "value"), optax.tree.get(new, "grad")
    return x_new, new, v_new, g_new, jnp.isfinite(v_new) & finite(g_new)


def segment_loop(body: Callable, state, it_end, running: Callable):
    """``body`` while ``running(state)`` and fewer than ``it_end`` iterations are done.

    The state counts its own iterations in ``state.it``; the jitted caller passes ``it_end``
    as an array, so that every segment is one program.

    Returns:
        The state at the end of the segment.
    """
    return jax.lax.while_loop(lambda s: running(s) & (s.it < it_end), body, state)


def drive(advance: Callable, carry: Any, *, done: int, budget: int, segment: int,
          report: Optional[Callable] = None):
    """Run jitted segments of at most ``segment`` iterations from ``done`` up to ``budget``.

    Args:
        advance: ``advance(carry, done, end) -> (carry, done, stopped)``: one jitted segment
            from ``done`` to at most ``end`` iterations, and, read on the host, the iterations
            done after it and whether the optimiser stopped (a traced run: one segment, which
            reports ``stopped``).
        carry: the optimiser's state (a pytree of arrays).
        done: iterations done before the first segment.
        budget: the iteration budget of this phase.
        segment: iterations a segment, >= 1.
        report: ``report(carry, done)`` after each segment (the host sees a signal there too).

    Returns:
        The state after the last segment.
    """
    while done < budget:
        carry, done, stopped = advance(carry, done, min(done + segment, budget))
        if report is not None:
            report(carry, done)
        if stopped:
            break
    return carry
