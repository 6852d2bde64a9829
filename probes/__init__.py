"""probes: ground-truth probe families and their oracles (DESIGN.md §5). Reads histories; never imports the engine."""

__all__: list[str] = []
