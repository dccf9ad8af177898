"""The masking chapter's dropout widget: the bits each tile regenerates.

The widget (renderer ``flashlib/book/js/dropout.js``) draws an n x n attention matrix of one
head cut into B x B tiles, each entry kept or dropped.  It needs no kernel: the table below
holds the generator's first 32-bit word of every entry (i, j) of the largest n, and the page
compares it with the threshold of p as :func:`flashlib.core.philox.dropout_keep` does
(``word >= floor(p * 2**32)`` keeps).  A smaller n shows the top-left corner of the same
table: an entry's bit depends on its position, never on the tile that draws it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashlib.core.philox import philox4x32

__all__ = ["DROPOUT_WIDGET", "dropout_widget_data"]

#: The widget's fixed parameters: one head, its flat index, the seed and the offset.
DROPOUT_WIDGET: dict[str, int] = {"head": 0, "seed": 2024, "offset": 0}


def dropout_widget_data(n_max: int, seed: int = DROPOUT_WIDGET["seed"],
                        head: int = DROPOUT_WIDGET["head"],
                        offset: int = DROPOUT_WIDGET["offset"]) -> dict[str, Any]:
    """The dropout widget's table: ``{"n": n_max, "seed", "head", "offset", "words": rows}``
    with ``words[i][j]`` the first output word (an int in [0, 2**32)) of Philox4x32-10 at the
    counter (i, j, head, offset) keyed by ``seed``, for 0 <= i, j < n_max."""
    rows, cols = np.arange(n_max)[:, None], np.arange(n_max)
    seed = int(seed)
    words = philox4x32((rows, cols, head, offset), (seed & 0xFFFFFFFF, seed >> 32))[0]
    return {"n": int(n_max), "seed": seed, "head": int(head), "offset": int(offset),
            "words": words.astype(np.int64).tolist()}
