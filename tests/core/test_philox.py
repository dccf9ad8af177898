"""The dropout generator: Philox4x32-10 as Random123 publishes it (its known-answer vectors),
vectorised over arrays, and a pure function of the position."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.core.philox import drop_threshold, dropout_keep, philox4x32

# Random123's kat_vectors: counter (4 words), key (2 words) -> output (4 words), Philox4x32-10
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_known_answer_vectors(counter, key, expected):
    out = philox4x32(counter, key)
    assert tuple(int(x) for x in out) == expected
    assert all(x.dtype == np.uint32 for x in out)


def test_vectorised_equals_one_by_one():
    rows, cols = np.arange(5)[:, None], np.arange(7)
    words = philox4x32((rows, cols, 3, 9), (11, 12))
    for i in range(5):
        for j in range(7):
            one = philox4x32((i, j, 3, 9), (11, 12))
            assert tuple(int(w[i, j]) for w in words) == tuple(int(x) for x in one)


def test_threshold_and_extremes():
    assert drop_threshold(0.0) == 0 and drop_threshold(0.5) == 2**31
    assert dropout_keep(5, 0, np.arange(50)[:, None], np.arange(50), 0.0).all()
    assert dropout_keep(2**64 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1, 0.5).shape == ()
