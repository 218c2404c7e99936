import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "thorough", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# doctests that compile or measure much (their functions are tested in tests/ too)
SLOW_DOCTESTS = {"radix_soa._warmup.warmup", "radix_soa._warmup.warmup_groups",
                 "radix_soa.studies.footprint.compare_footprint"}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)
