"""The Beyond chapter's merge tree (flashlib.studies.beyond.split_kv_tree): its root is the
library's split-KV output, behind the library's checks."""

from __future__ import annotations

import numpy as np
import pytest

from flashlib.fast.decoding import decode_attention, split_ranges
from flashlib.studies.beyond import split_kv_tree


def test_split_kv_tree_root_is_the_output_and_its_checks():
    rng = np.random.default_rng(5)
    q, K, V = rng.standard_normal((2, 8)), rng.standard_normal((100, 8)), rng.standard_normal(
        (100, 3))
    ranges, levels = split_kv_tree(q, K, V, 7)
    assert ranges == split_ranges(100, 7) and len(levels[0]) == len(ranges)
    _, l, acc = levels[-1][0]
    np.testing.assert_allclose(acc / l[:, None], decode_attention(q, K, V, n_splits=7),
                               atol=1e-13)
    for bad, err, match in [
        ({"n_splits": 0}, ValueError, "n_splits must be a positive integer"),
        ({"n_splits": 2.5}, TypeError, "n_splits must be an integer"),
        ({"K": np.zeros((0, 8)), "V": np.zeros((0, 3))}, ValueError, "at least one row"),
        ({"q": q[None], "K": K[None], "V": V[None]}, ValueError, "must be 2-D"),
        ({"q": q[None]}, ValueError, "equal leading"),
        ({"V": V[:50]}, ValueError, "v must have as many rows as k"),
        ({"q": np.full((1, 8), np.nan)}, ValueError, "q must contain only finite values"),
        ({"q": np.ones((1, 8), dtype=int)}, TypeError, "q must have a floating dtype")]:
        args = {"q": q, "K": K, "V": V, "n_splits": 3, **bad}
        with pytest.raises(err, match=match):
            split_kv_tree(args["q"], args["K"], args["V"], args["n_splits"])
