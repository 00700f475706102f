"""The Gaussian blow-up in float32 (JAX's default precision): tolerances and the
blow-up threshold follow the dtype, and a blow-up is reported as ``blowup`` (with its T*)
by both drivers in float32 as in float64 — not ``max_steps_reached`` or ``nonfinite``."""

import numpy as np
import pytest

import jaxdyn
from _references import riccati_blowup_time
from jaxdyn.gaussian._solve import dtype_threshold, dtype_tolerances

M0 = [0.5, 0.0]
S0 = [[0.5, 0.15], [0.15, 0.3]]
KW = dict(A=[[0.2, 0.5], [-0.5, 0.1]], B=[[1.0, 0.2], [-0.2, 0.5]], V=np.eye(2), b=[0.2, 0.0],
          t1=1.0)


def _cast(dtype):
    return {k: (np.asarray(v, dtype) if k != "t1" else v) for k, v in KW.items()}


def test_dtype_floors():
    assert dtype_tolerances(np.float32, 1e-8, 1e-10) == pytest.approx((1.1920929e-6, 1.1920929e-8))
    assert dtype_tolerances(np.float64, 1e-8, 1e-10) == (1e-8, 1e-10)  # float64 untouched
    assert dtype_threshold(np.float32, 1e6) == pytest.approx(8388.608)
    assert dtype_threshold(np.float64, 1e6) == 1e6


#: T* of the reference example (M0, S0 above), independently of the drivers: with V = I the
#: covariance solves a Riccati equation whose inverse Σ⁻¹ is linear, solved exactly by a
#: matrix exponential (tests/_references.py)
T_REF = riccati_blowup_time(KW["A"], KW["B"], S0, KW["t1"])


@pytest.mark.slow
def test_reference_example_blows_up_in_both_precisions():
    """Both drivers in float32, the batch driver in float64, against T_REF (the exact
    Riccati solution; the float64 single-member driver against it:
    test_reference_example_float64_single_driver, under -m slow)."""
    # float32, default tolerances (rtol = 1e-8 asked; raised to what float32 resolves)
    s32 = jaxdyn.solve_moments(np.asarray(M0, np.float32), np.asarray(S0, np.float32),
                               **_cast(np.float32))
    assert str(s32.names) == "blowup"
    assert int(s32.num_steps) < 200  # not 16 384 steps to max_steps
    assert abs(float(s32.blowup_time) - T_REF) / T_REF < 1e-5
    # the batch driver: the same member, plus a decaying one that must stay successful
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-9)):
        kw = _cast(dtype)
        kw["B"] = np.stack([kw["B"], -np.eye(2, dtype=dtype)])
        b = jaxdyn.solve_moments_batch(np.asarray(M0, dtype), np.asarray(S0, dtype), **kw)
        assert list(b.names) == ["blowup", "successful"], (dtype, list(b.names))
        assert abs(float(b.blowup_time[0]) - T_REF) / T_REF < tol
        assert np.isinf(float(b.blowup_time[1]))


@pytest.mark.slow  # default-suite counterpart: test_reference_example_blows_up_in_both_precisions
def test_reference_example_float64_single_driver():
    ref = jaxdyn.solve_moments(np.asarray(M0), np.asarray(S0), **_cast(np.float64))
    assert str(ref.names) == "blowup"
    assert abs(float(ref.blowup_time) - T_REF) / T_REF < 1e-9
