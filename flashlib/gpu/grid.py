"""The launch grid of the Triton kernels and the tiles each program visits (pure Python).

One program per (query block, batch x head): a grid of ``ceil(n_q / B_r) x (batch * heads)``
programs.  Program ``i`` loops over the key blocks ``0 .. ceil(hi / B_c)``, where ``hi = n_k``,
or with a causal mask ``min(n_k, (i + 1) B_r)``: the blocks wholly above the diagonal are
skipped (numpy's :func:`flashlib.core.masks.key_stop` in the same role); :func:`tile_map` paints
it.  Also the block sizes the launcher uses (:func:`configs`); nothing here needs torch or
triton, so the book's widget and the benchmark's bookkeeping run anywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flashlib.core.checks import check_int

__all__ = [
    "MIN_HEAD_DIM",
    "MAX_HEAD_DIM",
    "Config",
    "cdiv",
    "head_dim_block",
    "launch_grid",
    "key_block_end",
    "tiles_per_program",
    "SKIPPED",
    "FULL",
    "MASKED",
    "tile_map",
    "tile_counts",
    "configs",
]

#: The head dims the kernels take (any d in between; a tile is padded to a power of two).
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128


class Config(NamedTuple):
    """One launch configuration: tile B_r x B_c, and (compiled only) warps and pipeline stages."""

    B_r: int
    B_c: int
    num_warps: int = 4
    num_stages: int = 2


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers: the number of blocks of b that cover a."""
    return -(-a // b)


def head_dim_block(d: int) -> int:
    """The padded head dim D of a tile: d rounded up to a power of two, at least 16
    (``tl.arange`` needs a power of two, ``tl.dot`` at least 16)."""
    d = check_int(d, "d", minimum=1)
    return max(16, 1 << (d - 1).bit_length())


def launch_grid(n_q: int, batch_heads: int, B_r: int) -> tuple[int, int]:
    """The forward kernel's grid: (query blocks, batch * heads)."""
    n_q = check_int(n_q, "n_q", minimum=1)
    batch_heads = check_int(batch_heads, "batch_heads", minimum=1)
    B_r = check_int(B_r, "B_r", minimum=1)
    return cdiv(n_q, B_r), batch_heads


def key_block_end(i: int, B_r: int, n_k: int, causal: bool) -> int:
    """Where program ``i``'s loop over keys stops (exclusive): n_k, or with a causal mask the
    block's last row + 1 (no key after it is visible to any of its rows)."""
    return min(n_k, (i + 1) * B_r) if causal else n_k


def tiles_per_program(n_q: int, n_k: int, B_r: int, B_c: int, causal: bool = False) -> list[int]:
    """The number of K/V tiles each query-block program visits, for one batch x head."""
    n_q, n_k = check_int(n_q, "n_q", minimum=1), check_int(n_k, "n_k", minimum=1)
    B_r, B_c = check_int(B_r, "B_r", minimum=1), check_int(B_c, "B_c", minimum=1)
    return [cdiv(key_block_end(i, B_r, n_k, bool(causal)), B_c) for i in range(cdiv(n_q, B_r))]


#: Codes of :func:`tile_map`.
SKIPPED, FULL, MASKED = 0, 1, 2


def tile_map(n_q: int, n_k: int, B_r: int, B_c: int, causal: bool = False) -> np.ndarray:
    """What program i does with key tile j, for one batch x head: (ceil(n_q / B_r),
    ceil(n_k / B_c)) int8, SKIPPED (0: above the diagonal, never loaded), FULL (1) or MASKED
    (2: visited, and some of its scores are hidden, by the diagonal or by the end of the
    keys)."""
    visits = np.array(tiles_per_program(n_q, n_k, B_r, B_c, causal))
    i = np.arange(len(visits))[:, None]
    j = np.arange(cdiv(n_k, B_c))[None, :]
    ragged = (j + 1) * B_c > n_k
    straddles = ((j + 1) * B_c - 1 > i * B_r) if causal else np.zeros_like(ragged)
    codes = np.where(ragged | straddles, MASKED, FULL)
    return np.where(j < visits[:, None], codes, SKIPPED).astype(np.int8)


def tile_counts(n_q: int, n_k: int, B_r: int, B_c: int, causal: bool = False) -> dict[str, int]:
    """Tiles per batch x head: ``visited`` by the kernel, ``all`` of the grid, ``skipped``
    (above the diagonal), ``masked`` (visited tiles that need a mask: straddling the diagonal
    or the end of the keys)."""
    tiles = tile_map(n_q, n_k, B_r, B_c, causal)
    visited = int(np.count_nonzero(tiles))
    return {"visited": visited, "all": int(tiles.size), "skipped": int(tiles.size) - visited,
            "masked": int(np.count_nonzero(tiles == MASKED))}


def configs(d: int, dtype_name: str, mode: str) -> list[Config]:
    """Launch configurations to try, fastest first (the launcher falls back to the next one when
    a GPU lacks the shared memory or registers).

    The interpreter runs one program after another in numpy, so there the fewest, largest
    tiles are fastest; on a GPU, 128-row query blocks with 64-key tiles (the Triton tutorial's
    and FlashAttention-2's usual shape), fewer keys per tile for d = 128 in float32, and smaller
    tiles last, for GPUs with less shared memory.
    """
    D = head_dim_block(d)
    if mode == "interpreter":
        return [Config(64, 64, 1, 1)]
    wide = D > 64 or dtype_name == "float32"
    first = [Config(128, 32, 8, 2)] if D > 64 and dtype_name == "float32" else (
        [Config(128, 64, 8, 2)] if wide else [Config(128, 64, 4, 3)])
    return first + [Config(64, 64, 4, 2), Config(64, 32, 4, 1), Config(32, 32, 4, 1)]
