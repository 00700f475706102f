"""Every public driver and the step function of every experiment kind lower for ``cuda`` and
``tpu`` (``jax.export`` on this CPU machine), with no host callback and no CPU-only custom call
inside (``tests/export/``).

The cases run in one child process with ``EQX_ON_ERROR=nan``, equinox's documented setting for
programs that must run without a Python host: its runtime checks (diffrax's among them) are then
NaN selects instead of host callbacks, which no accelerator program can hold. jaxdyn's own drivers
report invalid traced input through their result codes, not through those checks.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # about 2 CPU-minutes: .ci/run runs it as its own step after the default suite
def test_every_driver_exports_for_cuda_and_tpu():
    env = {**os.environ, "EQX_ON_ERROR": "nan", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0",
                        str(HERE / "export")], env=env, cwd=HERE.parent, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
