"""Which keys each query may see: causal alignments, explicit masks, and their tiles.

Conventions follow PyTorch SDPA: a boolean mask is ``True`` where a query *may* attend.  A causal
mask is a diagonal ``offset``: row ``i`` sees key ``j`` when ``j <= i + offset``, with
``offset = 0`` for the top-left alignment (SDPA's ``is_causal``) and ``offset = n_k - n_q`` for
the bottom-right one (flash-attn >= 2.1).
"""

from __future__ import annotations

import numpy as np

from flashlib._validate import causal_offset, check_block, check_int

__all__ = [
    "causal_mask",
    "visible_keys",
    "key_stop",
    "straddles_diagonal",
    "hide_above_diagonal",
    "tile_mask",
    "causal_tiles",
]


def _diagonal(i0: int, i1: int, j0: int, j1: int, offset: int) -> np.ndarray:
    """Boolean (i1 - i0, j1 - j0): row i sees key j when j <= i + offset."""
    return np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + offset


def causal_mask(n_q: int, n_k: int, causal: bool | str = True) -> np.ndarray:
    """The boolean (n_q, n_k) causal mask for ``causal`` True/"top_left" or "bottom_right"."""
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    offset = causal_offset(causal, n_q, n_k)
    if offset is None:
        return np.ones((n_q, n_k), dtype=bool)
    return _diagonal(0, n_q, 0, n_k, offset)


def visible_keys(
    n_q: int, n_k: int, offset: int | None, mask: np.ndarray | None
) -> np.ndarray | None:
    """The full visibility matrix (..., n_q, n_k) of the causal diagonal AND ``mask``.

    Returns None when every key is visible.  Materialises n_q x n_k booleans: only the naive
    path uses it.
    """
    if offset is None:
        return mask
    tri = _diagonal(0, n_q, 0, n_k, offset)
    return tri if mask is None else mask & tri


def key_stop(i0: int, i1: int, n_k: int, offset: int | None) -> int:
    """One past the last key that any of the query rows ``[i0, i1)`` may see under the causal
    diagonal (``n_k`` when not causal).  Key blocks from here on are skipped entirely."""
    if offset is None:
        return n_k
    return max(0, min(n_k, i1 + offset))


def straddles_diagonal(i0: int, j1: int, offset: int | None) -> bool:
    """True when the tile of rows from ``i0`` and keys before ``j1`` has hidden causal entries
    (its top-right entry is hidden), so the mask must be applied to it."""
    return offset is not None and j1 - 1 > i0 + offset


def hide_above_diagonal(s: np.ndarray, i0: int, j0: int, offset: int) -> None:
    """Set the entries of the score tile ``s`` (..., B_r, B_c), rows from ``i0`` and keys from
    ``j0``, that the causal diagonal hides (key j > i + offset) to -inf, in place and row by
    row: unlike :func:`tile_mask`, no (B_r, B_c) boolean is built."""
    b_r, b_c = s.shape[-2:]
    for r in range(b_r):
        first_hidden = max(0, i0 + r + offset + 1 - j0)
        if first_hidden < b_c:
            s[..., r, first_hidden:] = -np.inf


def tile_mask(
    i0: int, i1: int, j0: int, j1: int, offset: int | None, mask: np.ndarray | None
) -> np.ndarray | None:
    """Visibility of the tile rows ``[i0, i1)`` x keys ``[j0, j1)``.

    mask: None or a boolean view broadcast to batch_shape + (n_q, n_k); only the tile is copied.
    Returns None when every entry of the tile is visible, so that the caller applies no mask;
    otherwise a boolean array broadcastable to (B, i1 - i0, j1 - j0), B = prod(batch_shape).
    """
    visible = _diagonal(i0, i1, j0, j1, offset) if straddles_diagonal(i0, j1, offset) else None
    if mask is not None:
        block = mask[..., i0:i1, j0:j1]
        if not block.all():
            block = block.reshape(-1, i1 - i0, j1 - j0)
            visible = block if visible is None else block & visible
    return visible


def causal_tiles(
    n_q: int, n_k: int, block_q: int, block_k: int, causal: bool | str = True
) -> tuple[int, int, int]:
    """(computed, masked, total) tiles of the (n_q, n_k) score matrix cut into B_r x B_c tiles.

    ``total`` is ceil(n_q / B_r) * ceil(n_k / B_c).  ``computed``: the tiles a causal
    FlashAttention visits, the key blocks before :func:`key_stop` of each query block (the
    others lie wholly above the diagonal and are skipped); ``masked``: those of them that
    straddle the diagonal (:func:`straddles_diagonal`) and need the mask.  Not causal
    (``causal=False``): every tile is computed, none masked.
    """
    block_q, block_k = check_block(block_q, "block_q"), check_block(block_k, "block_k")
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    offset = causal_offset(causal, n_q, n_k)
    computed = masked = 0
    for i0 in range(0, n_q, block_q):
        for j0 in range(0, key_stop(i0, min(i0 + block_q, n_q), n_k, offset), block_k):
            computed += 1
            masked += straddles_diagonal(i0, min(j0 + block_k, n_k), offset)
    total = -(-n_q // block_q) * -(-n_k // block_k)
    return computed, masked, total
