"""The median CI's binomial quantile in exact integer arithmetic equals scipy's binom.ppf."""

import pytest
from scipy.stats import binom

from kvbench.stats import half_binomial_ppf, median_ci


@pytest.mark.parametrize("q", [0.025, 0.005, 0.05])
def test_equals_scipy(q):
    for n in [*range(1, 300), 511, 1000, 1023, 1024, 1025, 2000]:
        assert half_binomial_ppf(q, n) == int(binom.ppf(q, n, 0.5)), n


def test_median_ci_by_hand():
    # n = 10: P(X <= 1) = 11/1024 < 0.025 <= P(X <= 2) = 56/1024, so k = 2 and the CI is
    # the order statistics x[1] and x[8] (0-based)
    assert half_binomial_ppf(0.025, 10) == 2
    assert median_ci(list(range(10))) == (1.0, 8.0)
