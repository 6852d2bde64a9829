"""hammer: deterministic load patterns, targets and the interpreter that drives them (DESIGN.md §5)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
