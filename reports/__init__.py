"""reports: statistics, tables, plots and rendered reports of hit-corruption rates (DESIGN.md §7).

Rendering lives in ``reports.render`` (``write_run_report``, ``write_comparison_report``), plots in
``reports.plots`` and the click commands in ``reports.cli``; they are not imported here so that
``import reports`` does not pull in matplotlib.
"""

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
from reports.planning import clean_trials_to_show_fix, fisher_power, requests_to_distinguish
from reports.tables import export, load_run, load_runs, rates

__all__ = [
    "ClusterRate",
    "Comparison",
    "Rate",
    "clean_trials_to_show_fix",
    "clopper_pearson",
    "cluster_rate",
    "compare",
    "export",
    "fisher_power",
    "load_run",
    "load_runs",
    "rates",
    "requests_to_detect",
    "requests_to_distinguish",
    "trials_to_claim_fix",
    "wilson",
]
