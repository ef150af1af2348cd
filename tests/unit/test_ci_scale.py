"""The suite's CI-scale switch (tests/support.py, tests/README.md "CI scale"): ``CI`` picks the scale unless
``DSTREAMS_TEST_FULL`` says otherwise; the large state's own variable wins over both."""

from __future__ import annotations

import pytest

from ..support import CI_STATE_KEYS, FULL_SCALE_ENV, FULL_STATE_KEYS, ci_scale, scaled, state_keys


@pytest.mark.parametrize(("ci", "full", "expected"), [
    (None, None, False),  # a developer's machine: the full scale
    ("true", None, True),  # CI
    ("1", None, True),
    ("false", None, False),
    ("true", "1", False),  # DSTREAMS_TEST_FULL=1 CI=true bash .ci/run: CI at the full scale
    ("true", "yes", False),
    (None, "0", True),  # the CI scale on a developer's machine
    ("true", "", True),  # empty: not set
])
def test_ci_decides_the_scale_unless_the_full_switch_is_set(monkeypatch, ci, full, expected):
    for name, value in (("CI", ci), (FULL_SCALE_ENV, full)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("DSTREAMS_TEST_STATE_KEYS", raising=False)
    assert ci_scale() is expected
    assert scaled("full", "ci") == ("ci" if expected else "full")
    assert state_keys() == (CI_STATE_KEYS if expected else FULL_STATE_KEYS)
    monkeypatch.setenv("DSTREAMS_TEST_STATE_KEYS", "1234")
    assert state_keys() == 1234
