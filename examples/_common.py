"""Shared by the examples: the ``--out`` folder and a non-interactive matplotlib."""

import argparse
import tempfile
from pathlib import Path


def out_dir(description: str) -> Path:
    """Parse ``--out`` (default: a new temporary folder) and return it, created."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the figure (default: a new temporary folder)")
    args = parser.parse_args()
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="jaxdyn-example-"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def pyplot():
    """Matplotlib's pyplot on the Agg backend (files only, no window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
