"""Every Python block of the documentation's home page and guides runs as written.

Each ```python block of docs/index.md and docs/guides/*.md runs alone in a fresh interpreter (as a
reader pasting it would: JAX's x64 mode off unless the block turns it on, matplotlib on Agg), in
a temporary folder; the blocks that claim float64 run with ``-m docs`` (CI's documentation
step), the others under ``-m slow`` too. JAX's warning that a requested float64 was truncated to float32 is an error
there, and a block that speaks of float64 must end with its arrays in float64. Blocks included
from examples/ (``--8<--``) run in tests/test_examples.py; a block that reads a run folder
(``runs/...``) must be one of README.md's, which tests/test_readme.py runs after making the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]

# Appended to a block: every float array it left behind is float64 (a block that claims float64).
FLOAT64_CHECK = """
import jax as _jax, numpy as _np
_floats = {_k: _v.dtype for _k, _v in list(globals().items())
           if isinstance(_v, (_jax.Array, _np.ndarray)) and _np.issubdtype(_v.dtype, _np.floating)}
assert _floats, "the block leaves no float array to check"
assert all(_d == _np.float64 for _d in _floats.values()), _floats
for _leaf in _jax.tree.leaves([_v for _v in globals().values() if hasattr(_v, "__dataclass_fields__")]):
    if isinstance(_leaf, _jax.Array) and _np.issubdtype(_leaf.dtype, _np.floating):
        assert _leaf.dtype == _np.float64, _leaf.dtype
"""


def python_blocks():
    """``(page, line, code)`` of each ```python block of the pages."""
    out = []
    for page in PAGES:
        lang, buf, start = None, [], 0
        for i, line in enumerate(page.read_text().splitlines(), 1):
            if lang is None:
                m = re.match(r"^```(\w+)\s*$", line)
                if m:
                    lang, buf, start = m.group(1), [], i
            elif line.startswith("```"):
                if lang == "python":
                    out.append((page, start, "\n".join(buf) + "\n"))
                lang = None
            else:
                buf.append(line)
    return out


BLOCKS = python_blocks()
# each block is a fresh interpreter (15-30 s of CPU on 2 cores): the blocks that claim float64
# run in the default suite, the others under -m slow
PARAMS = [pytest.param(b, marks=() if "float64" in b[2] or "--8<--" in b[2] or "runs/" in b[2]
                       else pytest.mark.slow) for b in BLOCKS]


def _id(block):
    page, start, _ = block
    return f"{page.relative_to(ROOT / 'docs')}:{start}"


def test_blocks_are_found():
    assert len(BLOCKS) >= 4
    assert any("float64" in code for _, _, code in BLOCKS)


@pytest.mark.docs
@pytest.mark.parametrize("block", PARAMS, ids=_id)
def test_python_block_runs_as_written(block, tmp_path):
    page, start, code = block
    where = _id(block)
    if code.lstrip().startswith("--8<--"):
        included = re.findall(r'--8<-- "(examples/[\w.]+)"', code)
        assert included and all((ROOT / p).exists() for p in included), where
        return  # run by tests/test_examples.py
    if "runs/" in code:
        assert code in (ROOT / "README.md").read_text(), (
            f"{where} reads a run folder; it must be a block of README.md (run by test_readme.py)")
        return
    body = code + (FLOAT64_CHECK if "float64" in code else "")
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-W", "error:Explicitly requested dtype:UserWarning",
                        "-c", compile_check(body, where)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{where}:\n{p.stderr[-4000:]}"


def compile_check(body: str, where: str) -> str:
    """The program that runs ``body`` under the block's name (so a traceback names the page)."""
    return f"exec(compile({body!r}, {where!r}, 'exec'))\n"
