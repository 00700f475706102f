"""The moment solvers' settings objects: ``MomentOptions`` and ``MomentBatchOptions``.

A solve's settings are one object passed as ``options=`` or its fields as keywords, which
replace those fields; the two spellings give the same solve. Bad settings are refused when the
options are made, by name, and a misspelt keyword names the nearest field.
"""

import dataclasses

import diffrax
import numpy as np
import pytest

from jaxdyn.gaussian import (MomentBatchOptions, MomentField, MomentOptions, solve_moments,
                             solve_moments_batch)
from jaxdyn._checks import settings_problem, with_settings

# V = I, B = I, A = 0 in d = 2 from S0 = I: Σ' = 2Σ², Σ(t) = I / (1 − 2t), T* = 1/2
I2 = np.eye(2)
FIELD = MomentField(0 * I2, I2, I2)


def test_keywords_replace_the_fields_of_the_options():
    """Keywords replace fields of the options given (the others kept); no keyword, no copy;
    no options, the defaults."""
    base = MomentOptions(rtol=1e-6, max_steps=100)
    merged = with_settings(MomentOptions, base, {"atol": 1e-9, "max_steps": 7})
    assert merged == MomentOptions(rtol=1e-6, atol=1e-9, max_steps=7)
    assert with_settings(MomentOptions, base, {}) is base
    assert with_settings(MomentBatchOptions, None, {}) == MomentBatchOptions()
    # the defaults are the solvers' documented ones
    assert (MomentOptions().rtol, MomentOptions().atol, MomentOptions().max_steps) == (
        1e-8, 1e-10, 16384)
    assert (MomentBatchOptions().rtol, MomentBatchOptions().chunk) == (1e-10, 64)
    names = {f.name for f in dataclasses.fields(MomentOptions)}
    assert {"solver", "stepsize_controller", "adjoint", "dt0", "throw"} <= names


def test_unknown_keywords_and_wrong_options_are_named():
    """A misspelt keyword is a TypeError naming the nearest field; options of the other solver
    are refused by class name; nothing is solved."""
    with pytest.raises(TypeError, match=r"solve_moments\(\) got unexpected keyword argument\(s\) "
                                        r"\['rtl'\].*\(did you mean 'rtol' for 'rtl'\?\)"):
        solve_moments(None, I2, field=FIELD, t1=1.0, rtl=1e-6)
    with pytest.raises(TypeError, match=r"\(did you mean 'chunk' for 'chunck'\?\)"):
        solve_moments_batch(None, I2, field=FIELD, t1=1.0, chunck=8)
    with pytest.raises(TypeError, match="takes options=MomentOptions.*got options of type "
                                        "MomentBatchOptions"):
        solve_moments(None, I2, field=FIELD, t1=1.0, options=MomentBatchOptions())
    with pytest.raises(TypeError, match="takes options=MomentBatchOptions"):
        solve_moments_batch(None, I2, field=FIELD, t1=1.0, options=MomentOptions())
    assert settings_problem(MomentOptions, None, {"rtol": 1e-3}, "f") is None
    msg = settings_problem(MomentOptions, None, {"zzz": 1}, "f")
    assert "'zzz'" in msg and "did you mean" not in msg and "rtol, atol" in msg


@pytest.mark.parametrize("make, match, err", [
    (lambda: MomentOptions(max_steps=0), "max_steps must be an integer >= 1", ValueError),
    (lambda: MomentOptions(max_steps=2.5), "max_steps must be an integer", ValueError),
    (lambda: MomentOptions(rtol=-1.0), "rtol must be >= 0", ValueError),
    (lambda: MomentOptions(atol=float("nan")), "atol must be >= 0 and finite", ValueError),
    (lambda: MomentOptions(blowup_threshold=1.0), "blowup_threshold must be > 1", ValueError),
    (lambda: MomentOptions(solver="dopri8"), "solver must be a diffrax solver", TypeError),
    (lambda: MomentOptions(stepsize_controller="pid"), "stepsize_controller must be a diffrax "
                                                       "step-size controller", TypeError),
    (lambda: MomentOptions(adjoint=diffrax.Dopri5()), "adjoint must be a diffrax adjoint",
     TypeError),
    (lambda: MomentBatchOptions(chunk=0), "chunk must be an integer >= 1", ValueError),
    (lambda: MomentBatchOptions(hmin_rel=0.0), "hmin_rel must be > 0", ValueError),
    (lambda: MomentBatchOptions(max_stiff_iterations=0), "max_stiff_iterations", ValueError),
    # through the solver's keywords: the same checks, when the merged options are made
    (lambda: solve_moments(None, I2, field=FIELD, t1=1.0, max_steps=0), "max_steps", ValueError),
])
def test_bad_settings_are_refused_by_name(make, match, err):
    with pytest.raises(err, match=match):
        make()


@pytest.mark.slow  # two spellings of one settings object (forwarding): the solve itself runs by default in tests/test_gaussian.py
def test_options_and_keywords_give_the_same_solve():
    """``options=MomentOptions(...)`` and the same fields as keywords: the same solve, bit for
    bit, and its blow-up at T* = 1/2 (the closed form); a keyword over options replaces that
    field only."""
    kw = dict(rtol=1e-9, atol=1e-12, blowup_threshold=1e5)
    a = solve_moments(None, I2, field=FIELD, t1=1.0, options=MomentOptions(**kw))
    b = solve_moments(None, I2, field=FIELD, t1=1.0, **kw)
    assert a.names == b.names == "blowup"
    assert float(a.blowup_time) == float(b.blowup_time)
    assert abs(float(a.blowup_time) - 0.5) < 1e-7
    c = solve_moments(None, I2, field=FIELD, t1=1.0, options=MomentOptions(**kw), max_steps=3)
    assert c.names == "max_steps_reached"
    batch = solve_moments_batch(None, I2, field=FIELD, t1=1.0,
                                options=MomentBatchOptions(rtol=1e-9, atol=1e-12))
    assert abs(float(batch.blowup_time[0]) - 0.5) < 1e-7
