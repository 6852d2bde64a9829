"""The probe suite as pytest tests: ``pytest --hammer-target embedded|URL --pyargs hammer.suite``.

Parametrized by the ``hammer`` plugin (``hammer.pytest_plugin``): one test per probe of each family.
"""


def test_probe_is_answered_alike_cold_and_cached(hammer_probe, hammer_run):
    """The probe asked twice (the second a cache hit where the engine caches) and cold: no oracle fires."""
    family, index = hammer_probe
    corrupted, run_dir = hammer_run(family, index)
    assert not corrupted, hammer_run.explain(family, index, corrupted, run_dir)
