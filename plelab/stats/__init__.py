"""Statistics for plelab's studies, in one place: what is plelab's own, on top of scipy.stats' distributions.

The distributions themselves (Student's t, the noncentral t, the normal, the binomial, Spearman's rho) are
scipy.stats'; this package says how a study uses them:

- paired: per-seed paired deltas, t tests and intervals, TOST equivalence, the four-way `compare` verdict.
- multiple: Holm's correction for a study's several comparisons.
- dose: per-seed dose-response slopes tested across seeds.
- nulls: exact sign-flip p, the simulated null of the curve-agreement (collapse) statistic.
- predictors: a predictor's accuracy beside the base-rate rule (exact McNemar, the sign test), a ranker beside
  the trivial one.
- power: power, minimum detectable effect and seeds needed, from a pilot's seed spread.

The seed is the unit of every test: things scored on the same runs (domains, doses sharing a reference run,
timeline points) are never treated as independent samples.
"""

from plelab.stats.dose import dose_response, slope
from plelab.stats.multiple import holm
from plelab.stats.nulls import curves_agree, sign_flip_p
from plelab.stats.paired import (
    ALPHA,
    OUTCOMES,
    compare,
    mean_se,
    mean_std,
    outcome_text,
    paired,
    significance,
    summarize,
    t_critical,
    t_interval,
    t_test,
    tost,
)
from plelab.stats.power import (
    equivalence_power,
    minimum_detectable_effect,
    plan_power,
    power,
    seeds_for_equivalence,
    seeds_needed,
)
from plelab.stats.predictors import accuracy_vs_base_rate, majority, ranker_vs_trivial, sign_test_p, spearman

__all__ = [
    "ALPHA", "OUTCOMES", "accuracy_vs_base_rate", "compare", "curves_agree", "dose_response", "equivalence_power",
    "holm", "majority", "mean_se", "mean_std", "minimum_detectable_effect", "outcome_text", "paired", "plan_power",
    "power", "ranker_vs_trivial", "seeds_for_equivalence", "seeds_needed", "sign_flip_p", "sign_test_p",
    "significance", "slope", "spearman", "summarize", "t_critical", "t_interval", "t_test", "tost",
]
