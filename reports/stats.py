"""What a hit-corruption rate like "3/30 before, 0/60 after" can and cannot claim.

A rate is k corrupted hit requests out of n hit requests. Every function here returns the counts
it was computed from alongside the estimate and an interval, so a report never prints a bare
percentage:

* ``wilson`` / ``clopper_pearson`` / ``rule_of_three``: how large the true rate may still be.
  "0/60" does not mean "never": at 95% it only rules out rates above 4.9% (one-sided exact).
* ``compare``: whether "before" and "after" differ by more than chance (Fisher's exact test,
  with Barnard's and Boschloo's unconditional tests reported beside it).
* ``cluster_rate``: the same questions when failures are sticky per branch or window, so
  requests are not independent trials.
* ``trials_to_claim_fix`` / ``requests_to_detect`` / ``detection_probability``: planning.

Zero trials (n = 0) is allowed and gives the vacuous answer: estimate ``nan`` and the interval
0..1, because no data is consistent with every rate. Tables with empty cells keep their rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

from scipy import stats
from statsmodels.stats.proportion import proportion_confint

__all__ = [
    "ClusterRate",
    "Comparison",
    "Rate",
    "clopper_pearson",
    "cluster_rate",
    "compare",
    "detection_probability",
    "requests_to_detect",
    "rule_of_three",
    "trials_to_claim_fix",
    "wilson",
]

Sided = Literal["two-sided", "upper", "lower"]
SIDES: tuple[str, ...] = ("two-sided", "upper", "lower")
# statsmodels names a one-sided interval by its alternative: "larger" gives [0, upper].
_STATSMODELS_SIDE = {"two-sided": "two-sided", "upper": "larger", "lower": "smaller"}
# Barnard and Boschloo enumerate every (n_before + 1) x (n_after + 1) table: ~0.4 s at 288 x 288,
# over a minute at 2000 x 2000. Past this many tables they are skipped (reported as None).
UNCONDITIONAL_MAX_TABLES = 160_000


def _pct(x: float) -> str:
    """A proportion as a percentage, keeping two significant digits for tiny values."""
    return f"{100 * x:.2g}%" if 0 < x < 0.001 else f"{100 * x:.1f}%"


@dataclass(frozen=True)
class Rate:
    """k successes (corrupted hits) in n trials (hits), with an interval for the true rate.

    ``sided`` says which bounds are informative: "upper" intervals have ``lower == 0`` and
    "lower" intervals have ``upper == 1`` by construction, not by measurement.
    """

    k: int
    n: int
    estimate: float
    lower: float
    upper: float
    method: str
    confidence: float
    sided: Sided = "two-sided"

    def __post_init__(self) -> None:
        _check_counts(self.k, self.n)
        _check_confidence(self.confidence, self.sided)
        if not 0.0 <= self.lower <= self.upper <= 1.0:
            raise ValueError(f"Rate bounds must satisfy 0 <= lower <= upper <= 1, "
                             f"got lower={self.lower}, upper={self.upper}")
        if self.n and not self.lower <= self.estimate <= self.upper:
            raise ValueError(f"Rate estimate={self.estimate} lies outside "
                             f"[{self.lower}, {self.upper}]")

    def describe(self) -> str:
        """E.g. "3/30 = 10.0% (95% Wilson CI 3.5%–25.6%)"."""
        if self.n == 0:
            return "0/0 = no trials (any rate 0%–100% is consistent)"
        level = f"{100 * self.confidence:g}% {self.method}"
        if self.sided == "upper":
            bound = f"{level} upper bound {_pct(self.upper)}"
        elif self.sided == "lower":
            bound = f"{level} lower bound {_pct(self.lower)}"
        else:
            bound = f"{level} CI {_pct(self.lower)}–{_pct(self.upper)}"
        return f"{self.k}/{self.n} = {_pct(self.estimate)} ({bound})"

    def __str__(self) -> str:
        return self.describe()


def _check_count(value: object, name: str, minimum: int = 0) -> None:
    """Raise unless ``value`` is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer count, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_counts(k: object, n: object, k_name: str = "k", n_name: str = "n") -> None:
    """Raise unless 0 <= k <= n are integer counts."""
    _check_count(n, n_name)
    _check_count(k, k_name)
    if k > n:
        raise ValueError(f"{k_name}={k} exceeds {n_name}={n}: more corrupted hits than hits")


def _check_probability(value: object, name: str, *, allow_one: bool = False) -> float:
    """Raise unless ``value`` is a real in (0, 1), or (0, 1] with ``allow_one``."""
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (0.0 < value < 1.0 or (allow_one and value == 1.0)):
        allowed = "(0, 1]" if allow_one else "(0, 1)"
        raise ValueError(f"{name} must be in {allowed}, got {value}")
    return float(value)


def _check_confidence(confidence: object, sided: object) -> None:
    """Raise unless ``sided`` is known and ``confidence`` fits it (one-sided needs >= 0.5)."""
    if sided not in SIDES:
        raise ValueError(f"sided must be one of {SIDES}, got {sided!r}")
    _check_probability(confidence, "confidence")
    if sided != "two-sided" and confidence < 0.5:
        raise ValueError(f"confidence must be in [0.5, 1) for a one-sided bound, "
                         f"got {confidence}; below 0.5 the bound excludes the estimate")


def _interval(k: int, n: int, confidence: float, sided: Sided, method: str, name: str) -> Rate:
    """The statsmodels interval ``method`` for k/n, as a validated ``Rate``."""
    _check_counts(k, n)
    _check_confidence(confidence, sided)
    if n == 0:
        return Rate(k, n, math.nan, 0.0, 1.0, name, float(confidence), sided)
    low, high = proportion_confint(k, n, alpha=1 - confidence, method=method,
                                   alternative=_STATSMODELS_SIDE[sided])
    estimate = k / n
    # Both intervals contain k/n exactly; rounding can leave Wilson's bound 1e-17 beyond it.
    low, high = min(float(low), estimate), max(float(high), estimate)
    return Rate(int(k), int(n), estimate, low, high, name, float(confidence), sided)


def wilson(k: int, n: int, confidence: float = 0.95, sided: Sided = "two-sided") -> Rate:
    """Wilson score interval: near-nominal average coverage, sensible at k = 0 and k = n."""
    return _interval(k, n, confidence, sided, "wilson", "Wilson")


def clopper_pearson(k: int, n: int, confidence: float = 0.95,
                    sided: Sided = "two-sided") -> Rate:
    """Clopper-Pearson exact interval: coverage never below ``confidence``, so conservative.

    The one-sided upper bound for 0/n is 1 - (1 - confidence)**(1/n): 4.87% for 0/60 at 95%.
    """
    return _interval(k, n, confidence, sided, "beta", "Clopper-Pearson")


def rule_of_three(n: int) -> Rate:
    """Approximate 95% one-sided upper bound 3/n for 0 failures in n trials (n >= 1)."""
    _check_count(n, "n", minimum=1)
    return Rate(0, int(n), 0.0, 0.0, min(1.0, 3 / n), "rule-of-three", 0.95, "upper")


@dataclass(frozen=True)
class Comparison:
    """Before/after hit-corruption rates and whether the difference exceeds chance.

    p-values named ``*_lower`` test "after is lower than before" one-sidedly; ``None`` means the
    table was too large for the unconditional test (see ``UNCONDITIONAL_MAX_TABLES``). The
    verdict follows Fisher's test alone, so it is exact and conservative; the unconditional
    tests are more powerful and can reject where Fisher does not (2/24 vs 0/48: Fisher p = 0.108,
    Barnard p = 0.040), which a report may mention but not call a fix.
    """

    before: Rate
    after: Rate
    alpha: float
    fisher_p_lower: float
    fisher_p_higher: float
    fisher_p_two_sided: float
    barnard_p_lower: float | None
    boschloo_p_lower: float | None
    verdict: str

    def describe(self) -> str:
        """Both rates, the one-sided Fisher p and the verdict on one line."""
        return (f"before {self.before}; after {self.after}; one-sided Fisher p = "
                f"{self.fisher_p_lower:.3g} (two-sided {self.fisher_p_two_sided:.3g}); "
                f"verdict at alpha={self.alpha:g}: {self.verdict}")

    def __str__(self) -> str:
        return self.describe()


def _verdict(p_lower: float, p_higher: float, alpha: float) -> str:
    """"fixed" / "regressed" only when the one-sided test rejects; otherwise no claim."""
    if p_lower <= alpha:
        return "fixed"
    if p_higher <= alpha:
        return "regressed"
    return "not shown fixed"


def _unconditional_p(test, table: list[list[int]], before_n: int, after_n: int) -> float | None:
    """One-sided (before > after) p of scipy's Barnard or Boschloo test, if affordable."""
    if before_n == 0 or after_n == 0:
        return 1.0  # an empty sample carries no evidence; scipy would return nan here
    if (before_n + 1) * (after_n + 1) > UNCONDITIONAL_MAX_TABLES:
        return None
    return float(test(table, alternative="greater").pvalue)


def compare(before_k: int, before_n: int, after_k: int, after_n: int,
            alpha: float = 0.05) -> Comparison:
    """Test whether the corruption rate fell (or rose) between two runs.

    The 2x2 table has columns (before, after) and rows (corrupted, clean); "greater" in scipy
    is "before's rate exceeds after's". "not shown fixed" is not "still broken": 2/20 vs 0/20
    cannot tell a fix from luck (two-sided Fisher p = 0.49).
    """
    _check_counts(before_k, before_n, "before_k", "before_n")
    _check_counts(after_k, after_n, "after_k", "after_n")
    alpha = _check_probability(alpha, "alpha")
    table = [[before_k, after_k], [before_n - before_k, after_n - after_k]]
    p_lower = float(stats.fisher_exact(table, alternative="greater").pvalue)
    p_higher = float(stats.fisher_exact(table, alternative="less").pvalue)
    return Comparison(
        before=wilson(before_k, before_n, 1 - alpha),
        after=wilson(after_k, after_n, 1 - alpha),
        alpha=alpha,
        fisher_p_lower=p_lower,
        fisher_p_higher=p_higher,
        fisher_p_two_sided=float(stats.fisher_exact(table).pvalue),
        barnard_p_lower=_unconditional_p(stats.barnard_exact, table, before_n, after_n),
        boschloo_p_lower=_unconditional_p(stats.boschloo_exact, table, before_n, after_n),
        verdict=_verdict(p_lower, p_higher, alpha),
    )


@dataclass(frozen=True)
class ClusterRate:
    """Rates over clusters (branches, windows) whose requests fail together.

    ``clusters``: clusters with at least one failure, out of all clusters (Wilson).
    ``pooled``: failed requests out of all requests, with the cluster-robust interval.
    ``design_effect``: cluster-robust variance over the binomial variance of ``pooled``.
    ``effective_n``: how many independent requests the data is worth, N / max(1, deff).
    """

    clusters: Rate
    pooled: Rate
    design_effect: float
    effective_n: float

    def describe(self) -> str:
        """Both rates and the design effect on one line."""
        return (f"clusters with a failure {self.clusters}; requests {self.pooled}, "
                f"design effect {self.design_effect:.3g} "
                f"(worth {self.effective_n:.3g} independent requests)")

    def __str__(self) -> str:
        return self.describe()


def _check_clusters(failures: Sequence[int], trials: Sequence[int]) -> None:
    """Raise unless both sequences have one valid (failures, trials >= 1) pair per cluster."""
    if len(failures) != len(trials):
        raise ValueError(f"failures_per_cluster has {len(failures)} entries but "
                         f"trials_per_cluster has {len(trials)}; give one of each per cluster")
    if not trials:
        raise ValueError("trials_per_cluster is empty; give at least one cluster")
    for i, (f, m) in enumerate(zip(failures, trials)):
        _check_count(m, f"trials_per_cluster[{i}]", minimum=1)
        _check_counts(f, m, f"failures_per_cluster[{i}]", f"trials_per_cluster[{i}]")


def _design_effect(failures: Sequence[int], trials: Sequence[int]) -> float:
    """Cluster-robust (CR1 sandwich) variance of the pooled ratio over its binomial variance.

    With r = F / N (F = sum f_i, N = sum m_i, G clusters), linearising the ratio gives

        Var_CR(r)  = G / (G - 1) * sum_i (f_i - r * m_i)**2 / N**2
        Var_bin(r) = r * (1 - r) / N,        deff = Var_CR / Var_bin.

    This equals statsmodels' OLS-on-a-constant variance with ``cov_type="cluster"``. With one
    cluster, or no failures or no successes, the spread between clusters cannot be estimated;
    we then assume every cluster fails or passes as a whole (deff = N / G, one trial per
    cluster), the worst case for sticky failures.
    """
    total, clusters = sum(trials), len(trials)
    rate = sum(failures) / total
    if clusters == 1 or rate in (0.0, 1.0):
        return total / clusters
    residual_ss = sum((f - rate * m) ** 2 for f, m in zip(failures, trials))
    robust_var = clusters / (clusters - 1) * residual_ss / total**2
    return robust_var / (rate * (1 - rate) / total)


def cluster_rate(failures_per_cluster: Sequence[int], trials_per_cluster: Sequence[int],
                 confidence: float = 0.95) -> ClusterRate:
    """Hit-corruption rates that respect stickiness within a branch or window.

    A corrupted cache slot keeps corrupting every hit on it until it is evicted, so the hits
    of one branch or window fail together: 10 failures in one branch are one event, not ten.
    Treating such requests as independent makes intervals far too narrow. The per-request
    interval is therefore Wilson on the effective sample, k = r * n_eff of n_eff = N / deff
    trials (Kish), never narrower than the binomial one.
    """
    _check_clusters(failures_per_cluster, trials_per_cluster)
    _check_confidence(confidence, "two-sided")
    failures, total = sum(failures_per_cluster), sum(trials_per_cluster)
    deff = _design_effect(failures_per_cluster, trials_per_cluster)
    effective_n = total / max(1.0, deff)
    rate = failures / total
    low, high = proportion_confint(rate * effective_n, effective_n, alpha=1 - confidence,
                                   method="wilson")
    low, high = min(float(low), rate), max(float(high), rate)  # rounding, as in _interval
    return ClusterRate(
        clusters=wilson(sum(f > 0 for f in failures_per_cluster), len(trials_per_cluster),
                        confidence),
        pooled=Rate(int(failures), int(total), rate, low, high,
                    "cluster-robust Wilson", float(confidence)),
        design_effect=float(deff),
        effective_n=float(effective_n),
    )


def _smallest_n(rate: float, confidence: float) -> int:
    """Smallest n with (1 - rate)**n <= 1 - confidence, i.e. ceil(ln(1-c) / ln(1-rate))."""
    if rate == 1.0:
        return 1
    miss = 1.0 - confidence
    n = max(1, math.ceil(math.log(miss) / math.log1p(-rate)))
    while n > 1 and (1.0 - rate) ** (n - 1) <= miss:  # ceil of a rounded ratio may overshoot
        n -= 1
    while (1.0 - rate) ** n > miss:  # or undershoot
        n += 1
    return n


def trials_to_claim_fix(base_rate: float, confidence: float = 0.95) -> int:
    """Clean trials needed to reject "still broken at ``base_rate``" at ``1 - confidence``.

    A still-broken engine passes n trials with probability (1 - p)**n; n = 29 for p = 10% at 95%.
    This treats ``base_rate`` as known. When it was itself measured on a few trials, use
    ``compare``: 3/30 before then 0/29 after is not shown fixed (one-sided Fisher p = 0.12).
    """
    base_rate = _check_probability(base_rate, "base_rate", allow_one=True)
    return _smallest_n(base_rate, _check_probability(confidence, "confidence"))


def requests_to_detect(rate: float, confidence: float = 0.95) -> int:
    """Requests needed to see at least one failure with probability ``confidence``."""
    rate = _check_probability(rate, "rate", allow_one=True)
    return _smallest_n(rate, _check_probability(confidence, "confidence"))


def detection_probability(rate: float, n: int) -> float:
    """Probability that n independent requests show at least one failure: 1 - (1 - rate)**n."""
    if isinstance(rate, bool) or not isinstance(rate, Real) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be a real number in [0, 1], got {rate!r}")
    _check_count(n, "n")
    if rate == 1.0:
        return 1.0 if n else 0.0
    return float(-math.expm1(n * math.log1p(-rate)))
