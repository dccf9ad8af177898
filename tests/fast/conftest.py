"""Fixtures of the fast paths' tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", params=["unshifted", "running max"])
def forward_path(request):
    """Both of flash_attention's paths on the same problems: bounded scores (|s| <= 63 in
    base 2, the usual case) skip the running maximum (flashlib.fast.forward.unshifted_ok);
    forcing that off runs the running-maximum path (stale maximum, exact steps, moved maxima).
    Module-scoped (set and restored by hand), so that hypothesis tests may use it."""
    import flashlib.fast.forward as forward

    real = forward.unshifted_ok
    if request.param == "running max":
        forward.unshifted_ok = lambda *args: False
    try:
        yield request.param
    finally:
        forward.unshifted_ok = real
