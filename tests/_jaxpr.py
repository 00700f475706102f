"""A program's largest intermediate array, for the tests that no N × N array is made."""

import numpy as np


def largest_array(jaxpr):
    """The largest number of elements of any value the program (and its sub-programs) makes."""
    def subs(v):
        if hasattr(v, "eqns"):
            yield v
        elif hasattr(getattr(v, "jaxpr", None), "eqns"):
            yield v.jaxpr
        elif isinstance(v, (tuple, list)):
            for u in v:
                yield from subs(u)

    def sizes(jp):
        for eqn in jp.eqns:
            for var in eqn.outvars:
                yield int(np.prod(var.aval.shape)) if hasattr(var.aval, "shape") else 0
            for v in eqn.params.values():
                for sub in subs(v):
                    yield from sizes(sub)

    return max(sizes(jaxpr.jaxpr))
