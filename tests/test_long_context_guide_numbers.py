"""The long-context guide's prose numbers, rendered from a result file's dynamics and collapse
tables (``jaxdyn.experiments.long_context.summary.GUIDE_RENDERERS``), on synthetic tables."""

from __future__ import annotations

import pytest

from jaxdyn.experiments import guide_numbers as gn
from jaxdyn.experiments.long_context import summary as lcs
from jaxdyn.experiments.long_context.schema import histogram_cells

R = lcs.GUIDE_RENDERERS


def _row(pred, counts, times, rate=0.5, mode=None, **extra):
    mean = sum(counts) / len(counts)
    sd = (sum((c - mean) ** 2 for c in counts) / len(counts)) ** 0.5
    row = {"first_count_predicted": pred, "first_count_mean": mean, "first_count_std": sd,
           "first_time_mean": sum(times) / len(times), "growth_rate_star": rate,
           "time_scale": 1 / rate, "mode_star": pred if mode is None else mode,
           "beta": 1.0, "seeds": len(counts), "first_counts": counts, "first_times": times}
    row.update(extra)
    return row


def _res(table, config="kind: long_context\n"):
    return {"kind": "long_context", "meta": {"config": config}, "results": {"table": table}}


def test_s1_ratios_gaps_times_and_cells():
    res = _res({"d=2,n=100000,c=0.0025": _row(100, [95, 96, 97], [6.0, 6.0, 6.4]),
                "d=2,n=10000,c=0.0025": _row(10, [9, 9, 9], [4.0, 4.0, 4.0])},
               config="kind: long_context\ncells_per_mode: 16\n")
    # rows in order of n; the range over the seeds where the file holds every seed's count
    assert R["count_ratio"](res) == ("0.900 (0.900–0.900) and 0.960 (0.950–0.970) of k* at "
                                     "n = 10⁴ and 10⁵ (the mean over 3 seeds; their standard "
                                     "deviation 0.0 and 0.82 clusters)")
    assert R["below_percent"](res) == "4.0 to 10 %"
    assert R["below"](res).startswith("below k* at every one of the 2 points, by 4.0 to 10 %")
    assert R["time_ratio"](res) == "2.0 and 3.1 (3.0–3.2) × 1/λ* at n = 10⁴ and 10⁵ (the mean over 3 seeds)"
    assert R["time_range"](res) == "2.0 to 3.1 × 1/λ* (the mean over 3 seeds at each of the 2 points)"
    # cells_per_mode from the recorded config: the power of 2 at or above 16 k*, at least 64
    assert histogram_cells(16, 10) == 256 and histogram_cells(2, 10) == 64
    assert R["cells"](res) == f"{gn.num(256 / 10)} and {gn.num(2048 / 100)} cells per k* at n = 10⁴ and 10⁵"


def test_a_point_above_its_prediction_is_not_called_below():
    res = _res({"d=2,n=256,c=0.01": _row(10, [11, 11, 11], [1.0, 1.0, 1.0]),
                "d=2,n=512,c=0.01": _row(10, [9, 9, 9], [1.0, 1.0, 1.0])})
    assert R["below"](res).startswith("below k* at 1 of the 2 points")


def test_an_older_file_without_seeds_counts_them_from_its_config():
    row = _row(100, [90, 92, 94], [4.0, 4.0, 4.0])
    for key in ("seeds", "first_counts", "first_times"):
        del row[key]
    res = _res({"d=2,n=1000,c=0.01": row}, config="sweep:\n  seed: [0, 1, 2]\n")
    assert R["count_ratio"](res) == ("0.920 of k* at n = 10³ (the mean over 3 seeds; their "
                                     "standard deviation 1.6 clusters)")
    one = _res({"d=2,n=1000000,c=0.01": dict(row, first_count_std=0.0)},
               config="sweep:\n  seed: [0]\n")
    assert R["count_ratio"](one) == "0.920 of k* at n = 10⁶ (one seed)"
    assert R["time_ratio"](one) == "2.0 × 1/λ* at n = 10⁶ (one seed)"


def test_s2_count_all_deviation_first_time_and_peak():
    res = _res({"d=3,n=10000,c=0.05": _row(200.0, [198, 202, 206], [3.0, 3.0, 3.0], rate=0.7,
                                           mode=31, peak_count_mean=240.0)})
    assert R["count_deviation"](res) == ("+1.0 % (−1.0 to +3.0 %) at n = 10⁴ (mean (range) over "
                                         "3 seeds; the seeds' standard deviation 3.3 clusters of "
                                         "N₁ = 200)")
    assert R["first_time"](res) == "t = 3.0 (λ* t = 2.10) at n = 10⁴ (each of the 3 seeds)"
    assert R["peak"](res) == "20 % above N₁ at n = 10⁴ (the mean peak of 3 seeds)"
    moved = _res({"d=3,n=10000,c=0.05": _row(200.0, [200, 200], [3.0, 3.4], rate=0.5, mode=31)})
    assert R["first_time"](moved) == ("t = 3.2 (3.0–3.4; λ* t = 1.60) at n = 10⁴ "
                                      "(mean (range) over 2 seeds)")


def test_ratio_by_mode_names_n_where_a_mode_repeats():
    res = _res({"d=3,n=256,c=0.2": _row(30.0, [33], [1.0], mode=10),
                "d=3,n=1024,c=0.05": _row(30.0, [45], [1.0], mode=10),
                "d=3,n=256,c=0.05": _row(9.0, [15], [1.0], mode=5)})
    assert R["ratio_by_mode"](res) == "1.67 at l* = 5 and 1.10 (n = 256) and 1.50 (n = 1024) at l* = 10"


def test_float32_and_largest_departure():
    res = _res({"d=2,n=1000000,c=0.0025": dict(_row(10, [9], [1.0]), beta=2.5e9)})
    assert R["float32"](res) == ("2.5·10⁹ at n = 10⁶, where float32's rounding would move the "
                                 "logits by β ε ≈ 300")
    col = _res({"d=4,n=1000,c=0.01": {"max_weight_median": 0.002, "limit_max_weight_median": 0.001},
                "d=2,n=1000,c=1": {"max_weight_median": 0.9, "limit_max_weight_median": 1.0}})
    assert R["largest_departure"](col) == ("+100 % at d = 4, c = 0.01, n = 10³ (median 0.00200 "
                                           "against the limit's 0.00100), where β = 1.0")


@pytest.mark.parametrize("what", ["count_ratio", "below", "time_ratio", "cells", "float32"])
def test_s1_phrases_render_from_the_committed_result_files(what):
    for stem in ("long_context_dynamics_large", "long_context_dynamics_million"):
        assert gn.render(f"{stem}.{what}")


def test_dt_check_names_the_first_frame_that_differs():
    times = [0.0, 0.2, 0.4]
    res = {"kind": "long_context", "meta": {}, "results": {
        "S²": {"coarse": {"dt": 0.2, "times": times, "counts": [0, 5, 7]},
               "fine": {"dt": 0.05, "times": times, "counts": [0, 5, 7]},
               "frames": 3, "frames_equal": 3},
        "S¹": {"coarse": {"dt": 0.2, "times": times, "counts": [0, 4, 7]},
               "fine": {"dt": 0.05, "times": times, "counts": [0, 5, 7]},
               "frames": 3, "frames_equal": 2}}}
    assert R["dt_check"](res) == (
        "a run at dt = 0.05 gives the same counts as dt = 0.2 at 3 of the 3 frames on S² and "
        "2 of the 3 frames on S¹ (the first that differs at t = 0.2: 5 clusters against 4) "
        "up to t = 0.4")
