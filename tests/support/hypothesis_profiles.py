"""Hypothesis profiles: `fast` for `make test`, `thorough` for CI (`make test-all`).

tests/conftest.py loads the one named by HYPOTHESIS_PROFILE (`fast` when unset); pytest's
`--hypothesis-profile=thorough` overrides it. Neither profile has a deadline or the too_slow
health check: both measure wall-clock time, which a loaded machine makes long for any example,
so they fail a correct test. `fast` is derandomized (every run tries the same examples, so a red
`make test` is never luck); `thorough` explores afresh on each run and prints the blob that
reproduces a failure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FAST = "fast"
THOROUGH = "thorough"

#: max_examples under `thorough`; a test's own count (see `examples`) is written at this scale.
_THOROUGH_EXAMPLES = 100

settings.register_profile(
    THOROUGH,
    max_examples=_THOROUGH_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    FAST,
    parent=settings.get_profile(THOROUGH),
    max_examples=_THOROUGH_EXAMPLES // 5,
    derandomize=True,
    print_blob=False,
)


def examples(thorough: int) -> int:
    """The max_examples of a test that wants `thorough` examples under the thorough profile:
    scaled by the loaded profile (a fifth of it under `fast`). Read when the test module is
    imported, which is after pytest loaded the profile."""
    return max(1, thorough * settings().max_examples // _THOROUGH_EXAMPLES)
