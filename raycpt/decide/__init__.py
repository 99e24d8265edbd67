"""Whether a short sweep's decision is the one a longer run would make (issue 47). Pure: numbers in, numbers out.

* :mod:`raycpt.decide.search` - each method at its own optimum: the edge-extension rule of the learning-rate
  search (a pick at the grid's edge extends the grid that way, up to a bound; still at an edge = *untuned*).
* :mod:`raycpt.decide.accuracy` - the short ranking against the long one: DataDecide's decision accuracy (all
  pairs of arms, seed means), the same on the pairs the long horizon separates beyond its own run noise, Kendall
  tau, top-1 regret in long-horizon run SDs, each pair's win probability from the short sweep's Welch model and
  its calibration (reliability table, expected calibration error).
* :mod:`raycpt.decide.record` - the record a decide run leaves for sweeps of the same settings, and the verdict's
  first line it gives them.
"""

from raycpt.decide.accuracy import (Arm, Decision, PairCall, arm_stats, calibration, decide, decision_accuracy,
                                    kendall_tau, pair_calls, top1_regret, win_probability)
from raycpt.decide.record import horizon_line, read_record, record_path
from raycpt.decide.search import RateRow, extend_rates, finite_mean, rate_rows

__all__ = ["Arm", "Decision", "PairCall", "RateRow", "arm_stats", "calibration", "decide", "decision_accuracy",
           "extend_rates", "finite_mean", "horizon_line", "kendall_tau", "pair_calls", "rate_rows", "read_record", "record_path",
           "top1_regret", "win_probability"]
