"""A printed status names itself.

``print(sol.result)`` and the repr of a result show the status name of each member (every
message is led by its name), for jaxdyn's codes and diffrax's, for one member and for a batch,
on the density solver's result.
"""

from __future__ import annotations

import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdyn
from jaxdyn import pde
from jaxdyn._results import RESULTS, STATUS_NAMES, from_codes, raise_if_failed


@pytest.mark.parametrize("name", STATUS_NAMES)
def test_every_status_prints_its_name(name):
    item = getattr(RESULTS, name)
    assert jaxdyn.status_messages(item).startswith(f"{name}: ")
    assert f"RESULTS<{name}: " in repr(item) and str(item) == repr(item)
    assert jaxdyn.status_names(item) == name


def test_diffrax_codes_keep_their_messages_after_the_name():
    for name in ("max_steps_reached", "dt_min_reached", "event_occurred"):
        upstream = getattr(diffrax.RESULTS, name)
        promoted = RESULTS.promote(upstream)
        assert jaxdyn.status_names(promoted) == name
        assert repr(promoted).endswith(f"<{name}: {diffrax.RESULTS[upstream]}>")
    # diffrax's own success has an empty message; promoted, it reads as a name
    assert repr(RESULTS.promote(diffrax.RESULTS.successful)).endswith("<successful: the solve "
                                                                      "finished with no failure.>")


def test_a_batch_prints_each_members_name():
    names = ["successful", "blowup", "nonfinite", "max_steps_reached"]
    text = repr(from_codes(np.array([jaxdyn.status_code(n) for n in names])))
    assert [m.group(1) for m in re.finditer(r"'(\w+): ", text)] == names


def test_raise_names_the_status_once():
    with pytest.raises(RuntimeError, match=r"^solve failed: blowup: Finite-time") as e:
        raise_if_failed(RESULTS.blowup)
    assert str(e.value).count("blowup") == 2  # "blowup: ...", and `blowup_time` in the message


def test_density_solution_prints_its_status():
    # tests/test_pde.py's call (one compiled program for both): diffrax stops at max_steps
    model = pde.CircleDensity(np.eye(2), np.eye(2), np.eye(2), 5.0, 32)
    rho0 = pde.uniform_density(32, jnp.float64)
    sol = pde.solve_density(model, rho0, t1=1.0, n_save=2, max_steps=5)
    assert sol.names == "max_steps_reached"
    assert repr(sol.result).endswith("RESULTS<max_steps_reached: The maximum number of solver "
                                     "steps was reached. Try increasing `max_steps`.>")
    assert "result=jaxdyn._results.RESULTS<max_steps_reached: " in repr(sol)
    # a batch of them (the result a vmapped solve returns): one name a member
    batch = jax.tree.map(lambda a, b: jnp.stack([a, b]), sol.result,
                         RESULTS.where(jnp.asarray(True), RESULTS.successful, sol.result))
    assert list(jaxdyn.status_names(batch)) == ["max_steps_reached", "successful"]
    assert [m.group(1) for m in re.finditer(r"'(\w+): ", repr(batch))] == ["max_steps_reached",
                                                                           "successful"]
