"""Rates, intervals, before/after tests, cluster-aware rates and trial planning (reports.stats)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from statsmodels.regression.linear_model import OLS

from reports.stats import (
    Rate,
    clopper_pearson,
    cluster_rate,
    compare,
    detection_probability,
    requests_to_detect,
    rule_of_three,
    trials_to_claim_fix,
    wilson,
)

INTERVALS = [wilson, clopper_pearson]
FAST = settings(max_examples=60, deadline=None)


@st.composite
def counts(draw, max_n=500):
    """A (k, n) pair with n >= 1 and 0 <= k <= n."""
    n = draw(st.integers(1, max_n))
    return draw(st.integers(0, n)), n


confidences = st.floats(0.5, 0.999)


def float_fields(obj):
    """The values of every field of a frozen dataclass that is declared as a float."""
    return [getattr(obj, name) for name, kind in obj.__annotations__.items()
            if kind in ("float", "float | None") and getattr(obj, name) is not None]


# --- Published and textbook values -------------------------------------------------------------


def test_wilson_textbook_three_of_thirty():
    """Wilson 95% for 3/30 is 3.46%-25.62%, and describe() prints it as counts plus interval."""
    rate = wilson(3, 30)
    assert rate.estimate == pytest.approx(0.1)
    assert (rate.lower, rate.upper) == pytest.approx((0.03460, 0.25621), abs=1e-5)
    assert rate.describe() == "3/30 = 10.0% (95% Wilson CI 3.5%–25.6%)"
    assert str(rate) == rate.describe()


def test_clopper_pearson_zero_of_sixty():
    """0/60: exact two-sided 95% upper is 1-0.025^(1/60) = 5.96%; one-sided is 1-0.05^(1/60)."""
    two_sided = clopper_pearson(0, 60)
    one_sided = clopper_pearson(0, 60, sided="upper")
    assert two_sided.upper == pytest.approx(1 - 0.025 ** (1 / 60), rel=1e-9)
    assert two_sided.upper == pytest.approx(0.0596, abs=1e-4)
    assert one_sided.upper == pytest.approx(1 - 0.05 ** (1 / 60), rel=1e-9)
    assert one_sided.upper == pytest.approx(0.0487, abs=1e-4)
    assert one_sided.lower == 0.0
    assert "upper bound 4.9%" in one_sided.describe()


def test_rule_of_three_is_three_over_n_and_never_below_the_exact_bound():
    """rule_of_three(n) = 3/n, and 3/n >= the exact one-sided 95% bound 1-0.05^(1/n)."""
    for n in (1, 2, 10, 60, 1000):
        rule = rule_of_three(n)
        assert rule.upper == pytest.approx(min(1.0, 3 / n))
        assert rule.upper >= clopper_pearson(0, n, 0.95, "upper").upper
    assert rule_of_three(1000).upper == pytest.approx(1 - 0.05 ** (1 / 1000), rel=5e-3)


@pytest.mark.parametrize("interval", INTERVALS)
def test_zero_trials_give_the_vacuous_interval(interval):
    """n = 0 claims nothing: estimate nan and bounds 0..1."""
    rate = interval(0, 0)
    assert math.isnan(rate.estimate)
    assert (rate.lower, rate.upper) == (0.0, 1.0)
    assert "no trials" in rate.describe()


# --- Interval properties -----------------------------------------------------------------------


@FAST
@given(counts(), st.floats(0.01, 0.999))
def test_intervals_match_scipy_binomtest(kn, confidence):
    """Wilson and Clopper-Pearson agree with scipy's independent binomtest implementation."""
    k, n = kn
    for method, interval in (("wilson", wilson), ("exact", clopper_pearson)):
        expected = stats.binomtest(k, n).proportion_ci(confidence, method=method)
        got = interval(k, n, confidence)
        assert (got.lower, got.upper) == pytest.approx((expected.low, expected.high), abs=1e-9)


@FAST
@given(counts(), confidences, st.sampled_from(["two-sided", "upper", "lower"]))
def test_interval_contains_estimate_within_unit_range(kn, confidence, sided):
    """0 <= lower <= k/n <= upper <= 1 for every method and side."""
    k, n = kn
    for interval in INTERVALS:
        rate = interval(k, n, confidence, sided)
        assert 0.0 <= rate.lower <= rate.estimate == k / n <= rate.upper <= 1.0


@FAST
@given(counts(max_n=40), st.integers(1, 20), confidences)
def test_width_shrinks_as_n_grows_at_a_fixed_rate(kn, scale, confidence):
    """At a fixed k/n, scaling both counts up strictly narrows the interval."""
    k, n = kn
    for interval in INTERVALS:
        small = interval(k * scale, n * scale, confidence)
        large = interval(k * (scale + 1), n * (scale + 1), confidence)
        assert large.upper - large.lower < small.upper - small.lower


@FAST
@given(counts(), confidences)
def test_one_sided_bounds_are_tighter_than_two_sided(kn, confidence):
    """A one-sided bound spends all of alpha on one side, so it lies inside the two-sided one."""
    k, n = kn
    for interval in INTERVALS:
        two = interval(k, n, confidence)
        assert interval(k, n, confidence, "upper").upper <= two.upper
        assert interval(k, n, confidence, "lower").lower >= two.lower


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.floats(0.001, 0.999), st.sampled_from([0.8, 0.9, 0.95]))
def test_clopper_pearson_coverage_never_below_confidence(n, p, confidence):
    """The exact probability that the CP interval covers p is at least the nominal confidence."""
    ks = np.arange(n + 1)
    covered = [clopper_pearson(int(k), n, confidence) for k in ks]
    inside = np.array([r.lower <= p <= r.upper for r in covered])
    assert stats.binom.pmf(ks, n, p)[inside].sum() >= confidence - 1e-9


# --- Before / after comparison -----------------------------------------------------------------


def test_two_of_twenty_vs_zero_of_twenty_is_not_shown_fixed():
    """2/20 -> 0/20: two-sided Fisher p = 0.4872 (published); no claim of a fix."""
    result = compare(2, 20, 0, 20)
    assert result.fisher_p_two_sided == pytest.approx(0.4872, abs=1e-4)
    assert result.fisher_p_lower == pytest.approx(0.2436, abs=1e-4)
    assert result.verdict == "not shown fixed"


def test_sixteen_of_288_vs_zero_of_288_is_fixed():
    """16/288 -> 0/288: two-sided Fisher p = 2.5e-5 (published); the fix is shown."""
    result = compare(16, 288, 0, 288)
    assert result.fisher_p_two_sided == pytest.approx(2.46e-5, rel=0.01)
    assert result.barnard_p_lower == pytest.approx(2.553e-5, rel=0.01)
    assert result.verdict == "fixed"


def test_three_of_thirty_vs_zero_of_sixty_is_fixed_at_five_percent():
    """3/30 -> 0/60: one-sided Fisher p = 0.0346 < 0.05, so "fixed", but not at alpha = 0.01."""
    result = compare(3, 30, 0, 60)
    assert result.fisher_p_lower == pytest.approx(0.03456, abs=1e-5)
    assert result.verdict == "fixed"
    assert compare(3, 30, 0, 60, alpha=0.01).verdict == "not shown fixed"


def test_two_of_24_vs_zero_of_48_is_not_shown_fixed_by_fisher():
    """2/24 -> 0/48: one-sided Fisher p = 0.108, so no fix is claimed (Barnard alone gives 0.040)."""
    result = compare(2, 24, 0, 48)
    assert result.fisher_p_lower == pytest.approx(0.1080, abs=1e-4)
    assert result.barnard_p_lower == pytest.approx(0.0402, abs=1e-3)
    assert result.verdict == "not shown fixed"


def test_a_rise_is_a_regression():
    """0/30 -> 5/30 rejects "after <= before" one-sidedly (p = 0.026): verdict "regressed"."""
    result = compare(0, 30, 5, 30)
    assert result.fisher_p_higher == pytest.approx(0.0261, abs=1e-4)
    assert result.verdict == "regressed"


def test_barnard_orientation_matches_a_brute_force_supremum():
    """Barnard's p for 3/12 -> 0/15 equals the max over the nuisance rate of P(Wald >= observed)."""
    nb, na = 12, 15
    x1, x2 = np.arange(nb + 1)[:, None], np.arange(na + 1)[None, :]
    pooled = (x1 + x2) / (nb + na)
    with np.errstate(divide="ignore", invalid="ignore"):
        wald = (x1 / nb - x2 / na) / np.sqrt(pooled * (1 - pooled) * (1 / nb + 1 / na))
    extreme = np.nan_to_num(wald, nan=0.0) >= wald[3, 0]
    sup = max((stats.binom.pmf(x1, nb, pi) * stats.binom.pmf(x2, na, pi))[extreme].sum()
              for pi in np.linspace(0.001, 0.999, 999))
    assert compare(3, nb, 0, na).barnard_p_lower == pytest.approx(sup, rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(counts(max_n=15), counts(max_n=15))
def test_fisher_one_sided_is_the_hypergeometric_tail(before, after):
    """One-sided Fisher p = P(X >= before_k), X hypergeometric given the margins."""
    (kb, nb), (ka, na) = before, after
    result = compare(kb, nb, ka, na)
    tail = stats.hypergeom.sf(kb - 1, nb + na, kb + ka, nb)
    assert result.fisher_p_lower == pytest.approx(tail, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(counts(max_n=15), counts(max_n=15))
def test_swapping_before_and_after_swaps_fixed_and_regressed(before, after):
    """compare(a, b) is "fixed" exactly when compare(b, a) is "regressed"."""
    forward, backward = compare(*before, *after), compare(*after, *before)
    assert (forward.verdict == "fixed") == (backward.verdict == "regressed")
    assert forward.fisher_p_lower == pytest.approx(backward.fisher_p_higher)


@settings(max_examples=40, deadline=None)
@given(counts(max_n=15), counts(max_n=15))
def test_boschloo_is_never_less_powerful_than_fisher(before, after):
    """Boschloo's one-sided p never exceeds Fisher's (it is uniformly more powerful)."""
    result = compare(*before, *after)
    assert result.boschloo_p_lower <= result.fisher_p_lower * (1 + 1e-9) + 1e-12


def test_large_tables_skip_unconditional_tests():
    """Past the table budget Barnard/Boschloo are None, and Fisher still decides the verdict."""
    result = compare(40, 2000, 0, 2000)
    assert result.barnard_p_lower is None and result.boschloo_p_lower is None
    assert result.verdict == "fixed"


def test_empty_after_run_claims_nothing():
    """0 trials after: every p is 1 and the verdict is "not shown fixed"."""
    result = compare(5, 10, 0, 0)
    assert (result.fisher_p_lower, result.barnard_p_lower, result.boschloo_p_lower) == (1, 1, 1)
    assert result.verdict == "not shown fixed"


# --- Cluster-aware rates -----------------------------------------------------------------------


def test_failures_in_one_cluster_give_a_wider_interval_than_spread_failures():
    """10 failures in one of ten branches are worth less evidence than one in each branch."""
    clustered = cluster_rate([10] + [0] * 9, [10] * 10)
    spread = cluster_rate([1] * 10, [10] * 10)
    assert clustered.pooled.estimate == spread.pooled.estimate == 0.1
    width = lambda r: r.pooled.upper - r.pooled.lower  # noqa: E731
    assert width(clustered) > 2 * width(spread)
    assert clustered.design_effect > 10 > spread.design_effect
    assert clustered.clusters.k == 1 and spread.clusters.k == 10


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 12)), min_size=2, max_size=12))
def test_design_effect_matches_statsmodels_cluster_robust_ols(pairs):
    """deff = statsmodels' cluster-robust variance of the mean over the binomial variance."""
    failures, trials = [min(f, m) for f, m in pairs], [m for _, m in pairs]
    total, rate = sum(trials), sum(failures) / sum(trials)
    result = cluster_rate(failures, trials)
    if rate in (0.0, 1.0):
        assert result.design_effect == pytest.approx(total / len(trials))
        return
    y = np.concatenate([[1.0] * f + [0.0] * (m - f) for f, m in zip(failures, trials)])
    groups = np.repeat(np.arange(len(trials)), trials)
    fit = OLS(y, np.ones_like(y)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    assert result.design_effect == pytest.approx(fit.bse[0] ** 2 / (rate * (1 - rate) / total))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 12)), min_size=1, max_size=12))
def test_cluster_interval_never_narrower_than_the_binomial_one(pairs):
    """Clustering can only cost evidence: the pooled interval contains plain Wilson's."""
    failures, trials = [min(f, m) for f, m in pairs], [m for _, m in pairs]
    result = cluster_rate(failures, trials)
    naive = wilson(sum(failures), sum(trials))
    assert result.pooled.lower <= naive.lower + 1e-12
    assert result.pooled.upper >= naive.upper - 1e-12
    assert 1.0 <= result.effective_n <= sum(trials)


def test_one_cluster_is_worth_one_trial():
    """A single branch cannot show how often branches fail: effective n falls back to 1."""
    result = cluster_rate([3], [30])
    assert result.effective_n == 1.0
    assert result.pooled.upper - result.pooled.lower > 0.5


def test_no_failures_fall_back_to_one_trial_per_cluster():
    """0 failures in 10 clusters of 6: the pooled bound is Wilson's 0/10, not 0/60."""
    result = cluster_rate([0] * 10, [6] * 10)
    assert result.effective_n == 10.0
    assert result.pooled.upper == pytest.approx(wilson(0, 10).upper)
    assert result.pooled.upper > wilson(0, 60).upper


def test_singleton_clusters_only_carry_the_small_sample_factor():
    """One request per cluster is independent sampling: deff = G/(G-1), the CR1 correction."""
    result = cluster_rate([1] * 5 + [0] * 45, [1] * 50)
    assert result.design_effect == pytest.approx(50 / 49)


# --- Trial planning ----------------------------------------------------------------------------


def test_trials_to_claim_fix_published_values():
    """10% at 95% needs 29 clean trials; 3% at 99% needs 152; 1% detection at 95% needs 299."""
    assert trials_to_claim_fix(0.10) == 29
    assert trials_to_claim_fix(0.03, 0.99) == 152
    assert requests_to_detect(0.01) == 299
    assert detection_probability(0.10, 29) == pytest.approx(0.95290, abs=1e-5)


def test_trials_to_claim_fix_agrees_with_the_exact_upper_bound():
    """After 29 clean trials the one-sided 95% CP bound drops below 10%; after 28 it does not."""
    n = trials_to_claim_fix(0.10)
    assert clopper_pearson(0, n, 0.95, "upper").upper <= 0.10
    assert clopper_pearson(0, n - 1, 0.95, "upper").upper > 0.10


def test_known_base_rate_plan_is_weaker_than_a_measured_comparison():
    """29 clean trials prove a known 10% rate gone, but 3/30 -> 0/29 is not shown fixed."""
    result = compare(3, 30, 0, trials_to_claim_fix(0.10))
    assert result.fisher_p_lower == pytest.approx(0.1249, abs=1e-4)
    assert result.verdict == "not shown fixed"


@st.composite
def plans(draw):
    """(rate, confidence), often on the boundary (1-rate)^n0 = 1-confidence where ceil rounds."""
    rate = draw(st.floats(1e-4, 0.9))
    if draw(st.booleans()):
        return rate, draw(st.floats(0.01, 0.9999))
    miss = (1 - rate) ** draw(st.integers(1, 2000))
    miss = draw(st.sampled_from([miss, math.nextafter(miss, 0), math.nextafter(miss, 1)]))
    return rate, 1 - miss


@settings(max_examples=300, deadline=None)
@given(plans())
def test_planned_n_is_the_smallest_that_suffices(plan):
    """(1-p)^n <= 1-confidence at the planned n, and not at n-1, even where ceil() rounds."""
    rate, confidence = plan
    if not 0 < confidence < 1:
        return
    n = requests_to_detect(rate, confidence)
    assert n == trials_to_claim_fix(rate, confidence)
    assert (1 - rate) ** n <= 1 - confidence
    assert n == 1 or (1 - rate) ** (n - 1) > 1 - confidence


def test_detection_probability_edges():
    """No requests or a zero rate detect nothing; a certain failure is seen in one request."""
    assert detection_probability(0.3, 0) == 0.0
    assert detection_probability(0.0, 100) == 0.0
    assert detection_probability(1.0, 1) == 1.0


# --- Types and validation ----------------------------------------------------------------------


def test_results_hold_plain_python_floats():
    """Every float field is a built-in float, never a numpy scalar."""
    comparison = compare(3, 30, 0, 60)
    clustered = cluster_rate([2, 0, 1], [10, 10, 10])
    objects = [wilson(3, 30), clopper_pearson(0, 60, sided="upper"), comparison,
               comparison.before, clustered, clustered.pooled, clustered.clusters]
    for obj in objects:
        assert float_fields(obj), obj
        assert all(type(value) is float for value in float_fields(obj)), obj
    assert type(detection_probability(0.1, 29)) is float
    assert type(trials_to_claim_fix(0.1)) is int


def test_rate_rejects_inconsistent_bounds():
    """A Rate whose interval excludes its own estimate cannot be constructed."""
    with pytest.raises(ValueError, match="estimate"):
        Rate(1, 10, 0.1, 0.2, 0.3, "Wilson", 0.95)
    with pytest.raises(ValueError, match="lower"):
        Rate(1, 10, 0.1, 0.0, 1.5, "Wilson", 0.95)


@pytest.mark.parametrize(("call", "error", "name"), [
    (lambda: wilson(5, 3), ValueError, "k=5 exceeds n=3"),
    (lambda: wilson(-1, 3), ValueError, "k must be >= 0"),
    (lambda: wilson(1, -3), ValueError, "n must be >= 0"),
    (lambda: wilson(1.5, 3), TypeError, "k must be an integer"),
    (lambda: clopper_pearson(1, True), TypeError, "n must be an integer"),
    (lambda: wilson(1, 3, confidence=1.0), ValueError, "confidence must be in"),
    (lambda: wilson(1, 3, confidence=0.3, sided="upper"), ValueError, "confidence must be in"),
    (lambda: wilson(1, 3, sided="both"), ValueError, "sided must be one of"),
    (lambda: rule_of_three(0), ValueError, "n must be >= 1"),
    (lambda: compare(3, 2, 0, 5), ValueError, "before_k=3 exceeds before_n=2"),
    (lambda: compare(0, 2, 0, -5), ValueError, "after_n must be >= 0"),
    (lambda: compare(1, 2, 0, 5, alpha=0), ValueError, "alpha must be in"),
    (lambda: cluster_rate([1, 2], [3]), ValueError, "failures_per_cluster has 2"),
    (lambda: cluster_rate([], []), ValueError, "trials_per_cluster is empty"),
    (lambda: cluster_rate([1, 0], [3, 0]), ValueError, r"trials_per_cluster\[1\] must be >= 1"),
    (lambda: cluster_rate([4], [3]), ValueError, r"failures_per_cluster\[0\]=4 exceeds"),
    (lambda: trials_to_claim_fix(0.0), ValueError, "base_rate must be in"),
    (lambda: trials_to_claim_fix(0.1, confidence=1), ValueError, "confidence must be in"),
    (lambda: requests_to_detect(1.5), ValueError, "rate must be in"),
    (lambda: detection_probability(-0.1, 3), ValueError, "rate must be"),
    (lambda: detection_probability(0.1, -3), ValueError, "n must be >= 0"),
])
def test_bad_arguments_are_named(call, error, name):
    """Every invalid argument raises an error that names it."""
    with pytest.raises(error, match=name):
        call()
