"""How many requests an experiment needs before its answer can mean anything.

``reports.stats`` answers "given a known base rate p, how many clean trials prove a fix"; the
questions here start from what a before-run actually measured:

* ``clean_trials_to_show_fix``: after k/n corrupted before, how many all-clean after-trials make
  one-sided Fisher reject "no change" (the verdict ``compare`` would call fixed).
* ``requests_to_distinguish``: how many requests per arm give a one-sided Fisher test the stated
  power to tell a rate p1 from a lower p2 ("~10% -> ~3%" in the first seed).

Both are exact: Fisher's one-sided p for before k1/n1 vs after k2/n2 is the hypergeometric tail
P(X >= k1), X ~ Hypergeom(total n1 + n2, failures k1 + k2, draws n1).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["clean_trials_to_show_fix", "fisher_power", "requests_to_distinguish"]

MAX_N = 1_000_000


def _fisher_p_lower(k1: np.ndarray | int, n1: int, k2: int, n2: int) -> np.ndarray:
    """One-sided Fisher p ("before's rate exceeds after's") for every k1, vectorised."""
    k1 = np.asarray(k1)
    return stats.hypergeom.sf(k1 - 1, n1 + n2, k1 + k2, n1)


def clean_trials_to_show_fix(before_k: int, before_n: int, alpha: float = 0.05) -> int | None:
    """Smallest n such that before_k/before_n vs 0/n gives one-sided Fisher p <= alpha.

    None when no n up to ``MAX_N`` does (before_k = 0: nothing to fix)."""
    if before_k == 0:
        return None
    if _fisher_p_lower(before_k, before_n, 0, MAX_N) > alpha:
        return None
    low, high = 0, 1
    while _fisher_p_lower(before_k, before_n, 0, high) > alpha:
        low, high = high, high * 2
    while high - low > 1:  # with after = 0/n the p-value falls as n grows
        mid = (low + high) // 2
        low, high = (mid, high) if _fisher_p_lower(before_k, before_n, 0, mid) > alpha else (low, mid)
    return high


def fisher_power(before_rate: float, after_rate: float, n: int, alpha: float = 0.05) -> float:
    """Exact probability that n requests per arm at the two true rates give one-sided Fisher p <= alpha."""
    k = np.arange(n + 1)
    before_pmf = stats.binom.pmf(k, n, before_rate)
    after_pmf = stats.binom.pmf(k, n, after_rate)
    power = 0.0
    for k2 in k[after_pmf > 1e-12]:
        rejects = _fisher_p_lower(k, n, int(k2), n) <= alpha
        power += after_pmf[k2] * before_pmf[rejects].sum()
    return float(power)


def requests_to_distinguish(before_rate: float, after_rate: float, alpha: float = 0.05,
                            power: float = 0.8) -> int | None:
    """Requests per arm for ``fisher_power`` >= ``power``: the first n found by doubling, then bisection.

    A discrete test's power saw-tooths in n, so a few n just above the answer can dip below
    ``power``; the answer is where it is first reached on that search, not a guarantee for every
    larger n. None when ``after_rate >= before_rate`` or no n up to 100,000 reaches it."""
    if not 0 <= after_rate < before_rate <= 1:
        return None
    low, high = 0, 8
    while fisher_power(before_rate, after_rate, high, alpha) < power:
        if high >= 100_000:
            return None
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fisher_power(before_rate, after_rate, mid, alpha) < power else (low, mid)
    return high
