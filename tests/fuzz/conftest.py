"""Hypothesis profiles of the fuzz tests: ``ci`` (default: a bounded campaign, a few seconds per target) and
``campaign`` (scripts/fuzz.sh: EDGEFM_FUZZ_EXAMPLES cases per target). No example database is written."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=150, deadline=None, database=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("campaign", max_examples=int(os.environ.get("EDGEFM_FUZZ_EXAMPLES", "5000")), deadline=None,
                          database=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("EDGEFM_FUZZ_PROFILE", "ci"))
