"""Shared hypothesis settings: a small CI profile (2-core CI machine, a few minutes at most)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "inkling-cache", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("inkling-cache")
