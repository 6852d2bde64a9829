"""reports: statistics, tables, plots and rendered reports of hit-corruption rates (DESIGN.md §7)."""

from reports.stats import (
    ClusterRate,
    Comparison,
    Rate,
    clopper_pearson,
    cluster_rate,
    compare,
    requests_to_detect,
    trials_to_claim_fix,
    wilson,
)

__all__ = [
    "ClusterRate",
    "Comparison",
    "Rate",
    "clopper_pearson",
    "cluster_rate",
    "compare",
    "requests_to_detect",
    "trials_to_claim_fix",
    "wilson",
]
