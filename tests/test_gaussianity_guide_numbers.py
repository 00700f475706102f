"""The gaussianity guide's numbers: the kind's summary per seed and its renderers.

The summary is checked on a small synthetic Dataset (two seeds), the renderers on the
committed result files ``docs/results/gaussianity/*.json`` (no runs): each reading agrees with
the per-seed arrays it summarises.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.gaussianity import summary as S

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / gn.RESULTS / "gaussianity").glob("*.json"))
GUIDE = ROOT / "docs" / "guides" / "gaussianity.md"


def _dataset():
    """Two seeds, one model, one scale, layers 0–2: seed 1 leaves the floor at layer 2 in kurtosis."""
    layer = np.arange(3)
    v = {"sw2": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
         "skew": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
         "kurt": [[1.0, 1.0, 2.0], [1.0, 1.0, 5.0]],
         "erank": [[10.0, 9.0, 8.0], [10.0, 8.0, 6.0]]}
    data = {}
    for name, rows in v.items():
        data[name] = (("seed", "layer"), np.asarray(rows))
        data[name + "_floor_mean"] = (("seed", "layer"), np.ones((2, 3)))
        data[name + "_floor_std"] = (("seed", "layer"), np.full((2, 3), 0.5))
    return xr.Dataset(data, coords={"seed": [3, 4], "layer": layer})


def test_summary_keeps_every_seed():
    cfg = {"model": "random", "scale": 1.0, "seed": 0, "architecture": "deit", "layers": None}
    r = S.summarize(cfg, _dataset())
    assert r["seeds"] == [3, 4]
    e = r["random, scale=1"]
    assert e["kurt"]["zscore"] == [[0.0, 0.0, 2.0], [0.0, 0.0, 8.0]]
    assert e["erank"]["value"][1] == [10.0, 8.0, 6.0]
    assert e["gaussian_layers_z_le_3"] == [[0, 1, 2], [0, 1]]
    res = {"results": r}
    assert S.departures(res, "random", 1.0) == [None, 2]
    assert S.guide_departure_at("random", 1.0)(res) == "layer 2 in 1 of 2 seeds, none in 1"
    assert S.departure_all(res, "random", 1.0) is None  # seed 3 stays within
    assert S.guide_departure_all("random")(res) == "s = 1: none"
    assert S.guide_input_zmax("random", ("kurt",))(res) == "0.0 (0.0–0.0)"
    ds = _dataset()
    ds["kurt"][0, 2] = 3.0  # seed 3 leaves at layer 2 as well: every seed is above from there
    both = {"results": S.summarize(cfg, ds)}
    assert S.departure_all(both, "random", 1.0) == 2
    assert S.guide_departure_all("random")(both) == "s = 1: layer 2"
    assert S.guide_erank("random", 1.0)(res) == "10.0 (10.0–10.0) → 7.00 (6.00–8.00)"
    assert S.guide_within("random")(res) == "5 of 6"
    assert S.guide_zmax("random", "kurt")(res) == "5.0 (2.0–8.0)"
    assert S.guide_zrange("random", "kurt")(res) == "0.0 to 8.0"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.stem)
def test_recorded_runs_hold_five_seeds_and_render_them(path):
    """Each committed run has >= 5 seeds per point; the table's cells, the first layer above the
    floor and the run's size are read from those seeds."""
    res = json.loads(path.read_text())
    assert res["kind"] == "gaussianity"
    seeds = res["results"]["seeds"]
    assert len(seeds) >= 5 and len(set(seeds)) == len(seeds)
    assert S.guide_run(res).startswith(f"{len(seeds)} seeds × {len(S._points(res))} grid point")
    for m, s in S._points(res):
        z = S.guide_array(res, m, s, "sw2")
        assert z.shape[0] == len(seeds)
        table = S.guide_table(m, s)(res).splitlines()
        assert len(table) == 2 + z.shape[1]  # header, rule, one row a layer
        for layer in (0, z.shape[1] - 1):
            assert table[2 + layer].split("|")[2].strip() == gn.spread(z[:, layer].tolist(), 2)
        worst = np.stack([S.guide_array(res, m, s, k) for k in ("sw2", "skew", "kurt")]).max(0)
        within = res["results"][f"{m}, scale={s:g}"]["gaussian_layers_z_le_3"]
        for first, row, ok in zip(S.departures(res, m, s), worst, within):
            if first is None:
                assert np.all(row <= S.Z_GAUSSIAN)
            else:
                assert row[first] > S.Z_GAUSSIAN and np.all(row[:first] <= S.Z_GAUSSIAN)
                assert list(range(first)) == ok[:first]


def test_the_guide_renders_from_the_recorded_runs():
    """Every span of the gaussianity guide names a recorded run and one of the kind's renderers."""
    text = GUIDE.read_text()
    keys = [m.group(2) for m in gn.SPAN.finditer(text)]
    assert {k.partition(".")[0] for k in keys} == {p.stem for p in RESULTS}
    for k in keys:
        assert k.partition(".")[2] in S.GUIDE_RENDERERS, k
