"""mini_engine: a compact inference engine for hybrid (Gated DeltaNet + attention) models.

It imports nothing from the harness packages; it emits instrumentation events that others read.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
