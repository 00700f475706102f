"""The long_context experiment kind: every config checks and plans (no compute), its warnings
name the regimes a size cannot resolve, bad configs are refused before compute; tiny runs of
each study end to end and the full configs under -m slow."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxdyn.config import ConfigError
from jaxdyn.experiments.kinds import get_kind
from jaxdyn.experiments.planning import grid_points, point_config, resolve_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("long_context_*.yaml"))
KIND = get_kind("long_context")


def _cfg(path, **over):
    raw = yaml.safe_load(Path(path).read_text())
    raw.update(over)
    return resolve_config(raw)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_checks_and_plans(path):
    cfg = _cfg(path)
    KIND.check(cfg)
    _, points = grid_points(cfg)
    assert points
    for p in points[:3]:
        pc = point_config(cfg, p)
        assert KIND.estimate_bytes(pc) > 0 and KIND.output_bytes(pc) > 0


def test_warnings_before_compute_and_named_refusals():
    coll = _cfg(ROOT / "configs" / "long_context_collapse.yaml", dtype="float32")
    warns = KIND.check(coll)
    assert any("not resolved" in w for w in warns)        # S¹ at n = 1e5 in float32
    assert any("β < 3" in w for w in warns)               # c = 0.01 at small n
    s2 = ROOT / "configs" / "long_context_dynamics_s2.yaml"
    assert not any("count is not resolved" in w for w in KIND.check(_cfg(s2)))
    big = KIND.check(_cfg(s2, sweep={"d": [3], "n": [100000], "c": [0.05], "seed": [0]}))
    assert any("about 2916 first clusters" in w and "count is not resolved" in w for w in big)
    phase = _cfg(ROOT / "configs" / "long_context_phase.yaml")
    assert any("not nearly equiangular" in w for w in KIND.check(phase))
    with pytest.raises(ConfigError, match="scale: log"):
        KIND.check(_cfg(ROOT / "configs" / "long_context_phase.yaml",
                        beta={"scale": "power", "c": 1.0}))
    with pytest.raises(ConfigError, match="S¹ .d = 2. or S²"):
        KIND.check(_cfg(ROOT / "configs" / "long_context_dynamics.yaml",
                        sweep={"d": [4], "c": [0.01]}))
    with pytest.raises(ConfigError, match="config field 'beta'.*scale"):
        KIND.check(_cfg(ROOT / "configs" / "long_context_collapse.yaml", beta={"scale": "cube"}))


def test_count_all_configs_and_their_warnings():
    """The S² configs at n = 10⁴..10⁶ count every particle and check without a warning; a c whose
    clusters are too small for the radius graph, and β ε over 1%, are named before compute."""
    for name in ("long_context_dynamics_s2_large", "long_context_dynamics_s2_million"):
        cfg = _cfg(ROOT / "configs" / f"{name}.yaml")
        assert cfg["count"] == "all" and cfg["kernel"] == "local"
        assert KIND.check(cfg) == []
    big = _cfg(ROOT / "configs" / "long_context_dynamics_s2_large.yaml", beta={"scale": "power",
                                                                               "c": 0.5})
    assert any("count is not resolved (lower c)" in w for w in KIND.check(big))
    s1 = _cfg(ROOT / "configs" / "long_context_dynamics.yaml", dtype="float32",
              sweep={"d": [2], "n": [100000], "c": [0.01], "seed": [0]})
    assert any("β ε = 12" in w for w in KIND.check(s1))


def test_predicted_mode_on_the_circle_past_the_bessel_range():
    """k*, λ* on S¹ from the Bessel rates, below and past β ≈ 2·10⁹ (where SciPy's scaled
    Bessel functions give NaN and jaxdyn.pde takes their ratios' continued fraction): the
    large-β limits √(2β) and 2/e (the maximum of (k²/β) e^{−k²/(2β)})."""
    import math

    from jaxdyn import pde
    from jaxdyn.experiments.long_context.run import predicted_mode

    for beta in (2.5e5, 2.5e7, 1e9):
        k, rate = predicted_mode(beta, 2)
        assert k == pde.most_unstable_mode(beta) == round(math.sqrt(2 * beta))
        assert rate == pytest.approx(2 / math.e, rel=1e-5)  # a finite-β correction O(1/β)
    k, rate = predicted_mode(2.5e9, 2)
    assert k == 70711 and rate == pytest.approx(2 / math.e, rel=1e-8)
    assert math.isfinite(rate)


def _run(path, out, *sets):
    args = [sys.executable, "-m", "jaxdyn.cli", "run", str(path), "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return yaml.safe_load((out / "summary.json").read_text())


TINY = {
    "long_context_collapse": ["sweep.n=[1000]", "sweep.d=[3]", "sweep.c=[0.1, 10.0]",
                              "sweep.seed=[0]", "queries=16", "limit_samples=20"],
    "long_context_phase": ["sweep.n=[64]", "sweep.rho=[0.5]", "sweep.gamma=[1.0, 3.0]",
                           "sweep.seed=[0]", "d=16"],
    "long_context_dynamics": ["sweep.n=[128]", "sweep.c=[0.01]", "sweep.seed=[0]", "t1=4.0"],
    "long_context_dynamics_s2": ["sweep.n=[128]", "sweep.c=[0.2]", "sweep.seed=[0]", "t1=4.0",
                                 "subsample=64"],
    "long_context_dynamics_s2_large": ["sweep.n=[2000]", "sweep.seed=[0]", "t1=2.0"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_runs_end_to_end(name, tmp_path):
    s = _run(ROOT / "configs" / f"{name}.yaml", tmp_path / "run", *TINY[name])
    assert s["status"] == "ok", s["status"]
    assert s["results"]["table"] and s["figures"]


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_full_configs_run(path, tmp_path):
    s = _run(path, tmp_path / "run")
    assert s["status"] == "ok"
