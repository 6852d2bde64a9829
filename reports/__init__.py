"""reports: statistics, tables, plots and rendered reports of hit-corruption rates (DESIGN.md §7)."""

__all__: list[str] = []
