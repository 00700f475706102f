"""Export a driver for accelerators without one: ``jax.export`` lowers a jitted function for
``cuda`` and ``tpu`` on this CPU machine; the lowered module must hold no host callback and no
CPU-only custom call (LAPACK, DUCC's FFT, the CPU callback targets).

What this checks: the program compiles for those platforms as far as JAX can tell without the
device (the StableHLO is platform-correct and serialisable). What it does not: that XLA's GPU or
TPU backend compiles it, or how fast it runs there.
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp

PLATFORMS = ("cuda", "tpu")
_TARGET = re.compile(r'(?:stablehlo\.custom_call @|call_target_name = ")([\w.$-]+)')
_FORBIDDEN = re.compile(r"callback|lapack|ducc|^cpu_|_cpu_|cpu$", re.IGNORECASE)


def summed(fn):
    """``fn``'s whole result as one number: every floating leaf summed (so that nothing of the
    result is dead code that the lowering could drop)."""
    def total(*args):
        out = fn(*args)
        leaves = [x for x in jax.tree.leaves(eqx.filter(out, eqx.is_array))
                  if jnp.issubdtype(x.dtype, jnp.inexact)]
        if not leaves:
            raise AssertionError(f"{getattr(fn, '__name__', fn)} returns no floating array")
        return sum(jnp.sum(x).astype(jnp.float32) for x in leaves)

    return total


def custom_call_targets(text: str) -> set:
    """The custom-call targets named in a StableHLO module's text."""
    return set(_TARGET.findall(text))


def export_check(fn, *args, platforms=PLATFORMS):
    """Export ``jax.jit(summed(fn))`` at ``args`` for each platform; fail on a host callback or a
    CPU-only custom call. Returns the custom-call targets seen per platform."""
    seen = {}
    for plat in platforms:
        exp = jax.export.export(jax.jit(summed(fn)), platforms=(plat,))(*args)
        targets = custom_call_targets(exp.mlir_module())
        bad = sorted(t for t in targets if _FORBIDDEN.search(t))
        assert not bad, f"{plat}: host callback or CPU-only custom call in the program: {bad}"
        assert exp.platforms == (plat,)
        seen[plat] = targets
    return seen
