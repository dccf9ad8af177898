"""What the forward and backward fast paths share: key tiles, the clamping floor, hidden entries.

- :func:`transposed_tiles`  K^T (or V^T) laid out once as contiguous ``(d + 1, B_c)`` tiles with a
  row of ones, the layout the matmul reads fastest;
- :func:`slow_below`, :func:`exp_floor`  where numpy's ``exp``/``exp2`` meet subnormal numbers
  (10 to 200 times slower), and the floor at which tiles are clamped to avoid them;
- :func:`hidden_entries`  which entries of a tile the causal diagonal, the window, the key
  padding or an explicit mask hide;
- :func:`max_row_norm`, :func:`row_max`  a bound on the scores, and fast row maxima.
"""

from __future__ import annotations

import math

import numpy as np

from flashlib.core.constants import LN2

__all__ = ["TILE_BYTES", "SHORT_ROWS", "transposed_tiles", "row_max", "slow_below", "exp_floor",
           "hidden_entries", "max_row_norm"]


#: The fast paths process the heads in groups whose (B_r, B_c) tiles together take at most
#: this many bytes (at least one head), so that a group's tile stays in the L2 cache: 8 heads
#: of the default float32 tile.  The grouping does not depend on the number of threads, so the
#: threaded result equals the single-threaded one bit for bit.
TILE_BYTES = 1 << 18


#: Row maxima of tiles up to this wide are taken on a transposed copy (:func:`row_max`).
SHORT_ROWS = 128


def transposed_tiles(x: np.ndarray, b_c: int, dtype: np.dtype,
                     factor: float | None = None) -> np.ndarray:
    """x (B, n, c) as contiguous tiles of [x^T; 1]: (B, ceil(n / b_c), c + 1, b_c), in ``dtype``,
    times ``factor`` if given (the ones row is not scaled).  Tile t holds rows [t b_c, (t + 1)
    b_c) of x as columns; the last tile's columns beyond n are left unset (callers slice them
    off).  The tile slice [:, t, :, :w] is what BLAS reads fastest: contiguous rows, unlike a
    column slice of one (c + 1, n) array whose row stride is n."""
    n_b, n, c = x.shape
    n_tiles = -(-n // b_c) if b_c else 0
    tiles = np.empty((n_b, n_tiles, c + 1, b_c), dtype=dtype)
    for t in range(n_tiles):
        j0, j1 = t * b_c, min(t * b_c + b_c, n)
        part = tiles[:, t, :c, : j1 - j0]
        part[...] = x[:, j0:j1].swapaxes(-1, -2)
        if factor is not None:
            part *= dtype.type(factor)
    tiles[:, :, c] = 1
    return tiles


def row_max(s: np.ndarray, s_t: np.ndarray | None) -> np.ndarray:
    """s.max(axis=-1) of a (G, B_r, B_c) tile; for short rows (B_c <= SHORT_ROWS) on the
    transposed copy ``s_t``, about twice as fast: numpy reduces a short last axis row by row,
    but the rows of the transposed copy element by element."""
    if s_t is None:
        return s.max(axis=-1)
    t = s_t[: s.shape[0], : s.shape[2], : s.shape[1]]
    np.copyto(t, s.swapaxes(-1, -2))
    return t.max(axis=-2)


def slow_below(dtype: np.dtype, exp: np.ufunc) -> float:
    """Arguments of ``exp``/``exp2`` below this may meet numpy's slow paths: 0.8 times the
    smallest normal exponent of ``dtype`` (about -100 for float32, in the units of ``exp``),
    with a margin for the products of P with values smaller than 1."""
    minexp = 0.8 * np.finfo(dtype).minexp
    return minexp if exp is np.exp2 else minexp * LN2


def exp_floor(dtype: np.dtype, exp: np.ufunc) -> np.floating:
    """The argument at which tiles are clamped when their scores may be very negative: half the
    smallest normal exponent of ``dtype`` (2**-63 for float32, 2**-511 for float64, in the units
    of ``exp``).  Subnormal numbers make float32 ``exp2`` 10 to 200 times slower, and the
    matmuls and in-place updates on a CPU without flush-to-zero several times slower; a floor
    this high keeps P, P V and the accumulator normal.  A term raised to 2**-63 against a row
    sum of at least 1/2 changes the output by less than n_k 2**-62 relative: far below float32
    rounding for any n_k that fits in memory."""
    half = np.finfo(dtype).minexp // 2  # -63 for float32
    return dtype.type(half if exp is np.exp2 else half * LN2)


def hidden_entries(
    i0: int, i1: int, j0: int, j1: int, straddles: bool, offset: int | None,
    mask: np.ndarray | None, heads: slice, lo: int | None = None,
    lengths: np.ndarray | None = None, bands: np.ndarray | None = None,
) -> np.ndarray | None:
    """The entries of the tile rows [i0, i1) x keys [j0, j1) that may not be seen: the causal
    diagonal's and the window's left edge ``lo`` (when the band ``straddles`` the tile), the key
    padding's (``lengths`` (G,) of the group) or the explicit mask's, as a boolean array
    broadcastable to (G, i1 - i0, j1 - j0) for the group ``heads``; None when none is hidden.
    bands: (G, 2), each sequence's own band (lo_g, hi_g) when they differ (key padding under a
    bottom-right band, :func:`flashlib.core.masks.sequence_bands`); ``offset`` and ``lo`` are
    then their loosest values and say only which sides are bounded."""
    hidden = None
    if bands is not None:
        keys, rows = np.arange(j0, j1)[None, None, :], np.arange(i0, i1)[None, :, None]
        lo_g, hi_g = bands[:, 0, None, None], bands[:, 1, None, None]
        if offset is not None and j1 - 1 > i0 + int(hi_g.min()):  # some band cuts the tile
            hidden = keys > rows + hi_g
        if lo is not None and j0 < i1 - 1 + int(lo_g.max()):
            below = keys < rows + lo_g
            hidden = below if hidden is None else hidden | below
    elif straddles:
        keys, rows = np.arange(j0, j1)[None, :], np.arange(i0, i1)[:, None]
        # booleans only: no (B_r, B_c) array of integers
        hidden = keys > rows + offset if offset is not None else np.zeros(
            (i1 - i0, j1 - j0), dtype=bool)
        if lo is not None:
            hidden |= keys < rows + lo
    if lengths is not None and j1 > lengths.min():
        padded = np.arange(j0, j1)[None, None, :] >= lengths[:, None, None]  # (G, 1, B_c)
        hidden = padded if hidden is None else hidden | padded
    if mask is not None:
        block = mask[..., i0:i1, j0:j1]
        if not block.all():
            block = block.reshape(-1, i1 - i0, j1 - j0)
            if block.shape[0] > 1:
                block = block[heads]
            hidden = ~block if hidden is None else hidden | ~block
    return hidden


def max_row_norm(x: np.ndarray) -> float:
    """The largest Euclidean norm of a row of x (..., n, d), computed in at least float32."""
    if x.size == 0:
        return 0.0
    dt = np.promote_types(x.dtype, np.float32)
    return math.sqrt(float(np.einsum("...i,...i->...", x, x, dtype=dt).max()))
