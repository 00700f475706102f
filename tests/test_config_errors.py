"""A config with several problems is refused once, naming every problem; an unknown field with
the closest known names and a pointer to the full list, not the list itself."""

import pytest
import yaml

from jaxdyn import cli
from jaxdyn.config import ConfigError
from jaxdyn.experiments import resolve_config

BAD = {"kind": "sphere", "betta": 3.0, "n": "many"}


def _write(tmp_path, cfg):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(p)


def _one_line(capsys):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxdyn: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", [["config"], ["run", "--quiet", "--out", "{tmp}/out"]],
                         ids=["config", "run"])
def test_misspelt_and_mistyped_fields_are_named_in_one_error(tmp_path, capsys, command):
    argv = [a.format(tmp=tmp_path) for a in command]
    assert cli.main([argv[0], _write(tmp_path, BAD), *argv[1:]]) == 2
    line = _one_line(capsys)
    assert "2 problems in the config" in line, line
    assert "(1) unknown config field 'betta'; did you mean 'beta'?" in line, line
    assert "(2) config field 'n': expected an integer" in line and "got 'many'" in line, line
    # a pointer to where every field is listed, not the list of the kind's fields
    assert "`jaxdyn kinds sphere`" in line, line
    assert "alibi_slope" not in line and "known fields here" not in line, line
    assert not (tmp_path / "out").exists()  # refused before the folder is made


def test_every_problem_is_kept_on_the_error():
    with pytest.raises(ConfigError) as e:
        resolve_config({**BAD, "weights": {"ensemble": "gaussian", "scal": 2.0},
                        "snapshots": [float("nan"), 1.0, "x"]})
    problems = e.value.problems
    assert len(problems) == 5, problems
    assert problems[0].startswith("unknown config field 'betta'")
    assert "unknown config field 'weights.scal'; did you mean 'scale'?" in problems
    assert any(p.startswith("config field 'snapshots[0]': must be finite") for p in problems)
    assert any(p.startswith("config field 'snapshots[2]': expected a number") for p in problems)


def test_an_unknown_field_of_a_small_section_lists_that_sections_fields():
    """With no close name, a section's few fields are listed (the kind's many are not)."""
    with pytest.raises(ConfigError) as e:
        resolve_config({"kind": "sphere", "weights": {"colour": 1}, "colour": 2})
    msg = str(e.value)
    assert "(1) unknown config field 'colour'; (2) unknown config field 'weights.colour'; " \
        "known fields here: K, Q, V," in msg, msg
    assert msg.endswith("; every field of kind 'sphere': `jaxdyn kinds sphere` "
                        "(or docs/guides/config-reference.md)"), msg
    assert "alibi_slope" not in msg


def test_one_problem_reads_as_before():
    with pytest.raises(ConfigError) as e:
        resolve_config({"kind": "sphere", "beta": 0.0})
    assert str(e.value) == "config field 'beta': must be > 0, got 0.0"
    assert e.value.problems == (str(e.value),)


def test_every_problem_of_the_sweep_is_named():
    with pytest.raises(ConfigError) as e:
        resolve_config({"kind": "sphere", "sweep": {"method": ["rk4"], "seed": [-1, 2.5]}})
    msg = str(e.value)
    assert msg.startswith("3 problems in the config: (1) config field 'sweep.method': "
                          "cannot sweep over 'method'"), msg
    assert "(2) config field 'sweep.seed[0]': a seed must be in [0, 2**32)" in msg, msg
    assert "(3) config field 'sweep.seed[1]': expected an integer" in msg, msg
