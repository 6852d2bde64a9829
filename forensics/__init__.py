"""forensics: the run-directory schema, slot ledger, attribution and shrinking (DESIGN.md §6)."""

__all__: list[str] = []
