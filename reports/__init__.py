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
from reports.tables import export, load_run, load_runs, rates

__all__ = [
    "ClusterRate",
    "Comparison",
    "Rate",
    "clopper_pearson",
    "cluster_rate",
    "compare",
    "export",
    "load_run",
    "load_runs",
    "rates",
    "requests_to_detect",
    "trials_to_claim_fix",
    "wilson",
]
