"""What the forward and backward fast paths share: BLAS calls, key tiles, the clamping floor.

- :func:`blas_matmul`  a tile product cut into BLAS calls of the size the matrix library runs
  fastest (:data:`CALL_MACS`, :data:`CALL_ROWS`);
- :func:`transposed_tiles`  K^T (or V^T) laid out once as contiguous ``(d + 1, B_c)`` tiles with a
  row of ones, the layout the matmul reads fastest;
- :func:`slow_below`, :func:`exp_floor`  where numpy's ``exp``/``exp2`` meet subnormal numbers
  (10 to 200 times slower), and the floor at which tiles are clamped to avoid them;
- :func:`hidden_entries`, :func:`hidden_parts`  which entries of a tile the causal diagonal,
  the window, the key padding or an explicit mask hide;
- :func:`max_row_norm`, :func:`row_max`  a bound on the scores, and fast row maxima;
- :func:`rows_seeing`, :func:`keys_seen`  which query blocks of a group may see a key block,
  and which key blocks of a group a query block may see.
"""

from __future__ import annotations

import math

import numpy as np

from flashlib.core.constants import LN2
from flashlib.core.masks import band_hides

__all__ = ["TILE_BYTES", "GROUP_TILES", "CALL_MACS", "CALL_ROWS", "SHORT_ROWS", "call_rows",
           "split_rows", "blas_matmul", "TileCall",
           "transposed_tiles", "row_max", "slow_below", "exp_floor", "hidden_entries",
           "max_row_norm", "rows_seeing", "keys_seen", "hidden_parts"]


#: The fast paths work on groups of tiles at once: the forward on up to :data:`GROUP_TILES`
#: query blocks of a head against one key block (a taller block of query rows, each of whose
#: tiles is a separate BLAS call), and on as many heads as fit; the backward likewise on up to
#: GROUP_TILES key blocks of a head against one query block.  A group's (B_r, B_c) tiles
#: together take at most TILE_BYTES bytes per tile buffer (at least one tile: the forward's S,
#: the backward's S and dP), so that they stay in the L2 cache.  The grouping does not depend
#: on the number of threads, so the threaded result equals the single-threaded one bit for
#: bit.  Measured (n = 4096, 8 heads, d = 64, 128 x 128 tiles, one thread, interleaved
#: medians): the block that stays put (the forward's query rows, the backward's keys) 8 tiles
#: tall ran the forward 2 to 7% faster than 4 tiles (fewer, larger steps: the Python
#: statements between the numpy calls cost less, and K and V stream past half as often) and
#: the backward 4% faster; 16 tiles, or 2 heads of 8 tiles, were no faster or slower (the
#: group's tiles and operands outgrow the 2 MiB L2 cache).  Measured again for the backward
#: alone during its rework of December 2026 (the products written into free tiles, dQ's share added
#: key block by key block; interleaved medians of 5 to 7 against 8 tiles): 4 key blocks 1.6 to
#: 4% slower, 6 or 7 key blocks within 1% either way, 16 (TILE_BYTES doubled) 1 to 2.5% slower;
#: visiting a group's key blocks in reverse order every other query block (so that the blocks
#: used last are used first next) made no difference.
TILE_BYTES = 1 << 19
GROUP_TILES = 8


#: The largest BLAS call the fast paths make, in multiply-adds (M N K): OpenBLAS multiplies
#: products up to 100**3 with its small-matrix kernels (kernel/x86_64/
#: sgemm_small_kernel_permit_skylakex.c, SkylakeX and later kernels), which read the operands
#: where they lie, without packing them first; one multiply-add more and the product takes the
#: general path: measured here (one thread, Intel Xeon with AVX-512), batches of 64 x 65 @
#: 65 x 256 products (1.06 million multiply-adds) ran at about 130 GFLOP/s, of 64 x 65 @
#: 65 x 128 at 170 to 215, and of 128 x 65 @ 65 x 128 at 110 against 64 x 65 @ 65 x 128's
#: 190.  :func:`blas_matmul` cuts every tile product into calls below this.
CALL_MACS = 100**3
#: ... and the most rows of the left operand one BLAS call gets: with 128 x 128 tiles and
#: d = 64, 64 rows keep every product of the forward and backward (64 x 64 x 128,
#: 64 x 128 x 64) below CALL_MACS; 96- and 32-row calls ran 0 to 5% slower.  Which operand is
#: which matters as much: the small-matrix kernels run fastest when the right operand (OpenBLAS's
#: column-major A) is the one that stays in the L1 cache across a batch of calls (64 x 65 @
#: 65 x 128, in cache: 164 GFLOP/s with a shared right operand, 138 with a shared left one),
#: and refuse a transposed right operand outright (``sgemm_small_kernel_permit``: a "TN" call
#: with M N > 1200 takes the general path, 60% slower here): the backward lays its tiles out
#: transposed for that reason (:mod:`flashlib.fast.backward`).  Padding a tile's rows (a row
#: stride of 136 or 144 floats instead of 128) sped single products up 0 to 4% in cache but
#: made the backward 13% slower (numpy's passes over a strided tile).
CALL_ROWS = 64


#: Row maxima of tiles up to this wide are taken on a transposed copy (:func:`row_max`):
#: measured (numpy 2.4, AVX-512), the maxima of a (8, 128, 64) tile took 90 us that way against
#: 236 us along its rows, but of a (2, 512, 128) tile 332 us against 200 us.
SHORT_ROWS = 64


def _blocks(n: int, size: int) -> list[tuple[int, int, int, int]]:
    """[start, stop) of the whole blocks of ``size`` in range(n) and of the rest, each with its
    block count and block size: at most two entries."""
    whole = n - n % size
    parts = [(0, whole, whole // size, size)] if whole else []
    if whole < n:
        parts.append((whole, n, 1, n - whole))
    return parts


def call_rows(n: int, k: int, m: int) -> tuple[int, int]:
    """(rows, cols): the blocks of an (n, k) @ (k, m) product that :func:`blas_matmul` hands to
    BLAS one call each: blocks of :data:`CALL_ROWS` rows (equal blocks of at most that many
    when n is smaller than two of them), halved while they exceed :data:`CALL_MACS`
    multiply-adds, down to 32 rows (large d: 32 x 128 @ 128 x 128 products ran faster than
    64-row ones split into column halves); then of all m columns if that fits, else of equal
    blocks of columns that do."""
    rows = -(-n // -(-n // CALL_ROWS)) if n else 1
    while rows > 32 and rows * k * m > CALL_MACS:
        rows = -(-rows // 2)
    if rows * k * m <= CALL_MACS:
        return rows, max(m, 1)
    cols = max(1, CALL_MACS // (rows * k))
    return rows, -(-m // -(-m // cols))


def split_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """x (..., n, m) as (..., n / rows, rows, m): a view (rows must divide n)."""
    return x.reshape(x.shape[:-2] + (x.shape[-2] // rows, rows, x.shape[-1]))


def blas_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` cut into BLAS calls of at most :data:`CALL_ROWS` rows of
    ``a`` and :data:`CALL_MACS` multiply-adds, the size OpenBLAS runs fastest.

    a: (G, n, k), b: (G or 1, k, m) (broadcast over the group), out: (G, n, m); any strides
    BLAS accepts (transposed views included).  The rows are cut into equal blocks (and a
    remainder), the columns only when a block of rows times all of them would exceed
    CALL_MACS (large d) (:func:`call_rows`): every block is a view, so numpy loops over them
    in C, one call each.  The same entries are computed as by one call, each a dot product of
    length k."""
    n, k = a.shape[-2:]
    m = out.shape[-1]
    rows, cols = call_rows(n, k, m)
    if cols >= m:
        if rows >= n:
            return np.matmul(a, b, out=out)
        for r0, r1, _count, size in _blocks(n, rows):
            np.matmul(split_rows(a[..., r0:r1, :], size), b[..., None, :, :],
                      out=split_rows(out[..., r0:r1, :], size))
        return out
    for r0, r1, count, size in _blocks(n, rows):
        a_r = a[..., r0:r1, :].reshape(a.shape[:-2] + (count, 1, size, k))
        for c0, c1, c_count, c_size in _blocks(m, cols):
            b_c = b[..., :, c0:c1].reshape(b.shape[:-1] + (c_count, c_size))
            o = out[..., r0:r1, c0:c1].reshape(out.shape[:-2] + (count, size, c_count, c_size))
            np.matmul(a_r, np.moveaxis(b_c, -2, -3)[..., None, :, :, :],
                      out=o.swapaxes(-2, -3))
    return out


class TileCall:
    """``blas_matmul(a, b, out)`` into a fixed ``out`` for any ``a`` and ``b`` of the shapes it
    was made for: the blocks of ``out`` laid out once, so that a loop that fills the same tile
    buffer many times pays one numpy call per product (the Python statements around the BLAS
    calls are a fast path's main overhead).  k: the length of the dot products."""

    __slots__ = ("out", "blocks", "rows", "cols", "mode")

    def __init__(self, out: np.ndarray, k: int) -> None:
        n, m = out.shape[-2:]
        rows, cols = call_rows(n, k, m)
        self.rows, self.cols, self.out = rows, cols, out
        if n % rows or m % cols:  # a remainder: blas_matmul's several numpy calls
            self.mode, self.blocks = "any", out
        elif cols < m:  # (..., n / rows, m / cols, rows, cols)
            self.mode = "rows and columns"
            self.blocks = out.reshape(out.shape[:-2] + (n // rows, rows, m // cols, cols)
                                      ).swapaxes(-2, -3)
        elif rows < n:  # (..., n / rows, rows, m)
            self.mode, self.blocks = "rows", split_rows(out, rows)
        else:
            self.mode, self.blocks = "one", out

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """out = a @ b; returns out."""
        mode = self.mode
        if mode == "rows":
            np.matmul(split_rows(a, self.rows), b[..., None, :, :], out=self.blocks)
        elif mode == "one":
            np.matmul(a, b, out=self.out)
        elif mode == "rows and columns":
            k, m = b.shape[-2:]
            b_c = b.reshape(b.shape[:-1] + (m // self.cols, self.cols))
            np.matmul(split_rows(a, self.rows)[..., None, :, :],
                      np.moveaxis(b_c, -2, -3)[..., None, :, :, :], out=self.blocks)
        else:
            blas_matmul(a, b, self.out)
        return self.out

    def left(self, a: np.ndarray) -> np.ndarray:
        """``a`` as :meth:`run` takes it (a view): an operand that stays put is laid out once."""
        mode = self.mode
        if mode == "rows":
            return split_rows(a, self.rows)
        if mode == "rows and columns":
            return split_rows(a, self.rows)[..., None, :, :]
        return a

    def right(self, b: np.ndarray) -> np.ndarray:
        """``b`` as :meth:`run` takes it (a view)."""
        mode = self.mode
        if mode == "rows":
            return b[..., None, :, :]
        if mode == "rows and columns":
            m = b.shape[-1]
            b_c = b.reshape(b.shape[:-1] + (m // self.cols, self.cols))
            return np.moveaxis(b_c, -2, -3)[..., None, :, :, :]
        return b

    def run(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """out = a @ b from operands laid out by :meth:`left` and :meth:`right`; returns out.
        One numpy call (but for a remainder of rows or columns: :func:`blas_matmul`)."""
        if self.mode == "any":
            return blas_matmul(a, b, self.out)
        np.matmul(a, b, out=self.blocks)
        return self.out


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
    transposed copy ``s_t``, faster: numpy reduces a short last axis row by row, but the rows
    of the transposed copy element by element."""
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


def rows_seeing(i0: int, i1: int, j0: int, j1: int, block_q: int, lo: int | None,
                hi: int | None) -> tuple[int, int]:
    """[r0, r1): the rows of the group of query rows [i0, i1) (relative to i0, whole query
    blocks of ``block_q``) that may see a key of [j0, j1) under the band (lo, hi) (row i sees
    keys i + lo <= j <= i + hi; None: no bound); r0 >= r1 when none does.  The query blocks
    of a group that the band hides from a key block entirely are skipped with it."""
    first = 0 if hi is None else max(0, j0 - hi - i0)  # rows i >= j0 - hi reach key j0
    stop = i1 - i0 if lo is None else min(i1 - i0, max(0, j1 - lo - i0))  # i + lo <= j1 - 1
    return first - first % block_q, min(i1 - i0, -(-stop // block_q) * block_q)


def keys_seen(i0: int, i1: int, j0: int, j1: int, block_k: int, lo: int | None,
              hi: int | None, length: int | None = None) -> tuple[int, int]:
    """[c0, c1): the key blocks of the group of keys [j0, j1) (relative, ``block_k`` keys each)
    that some row of [i0, i1) may see under the band (lo, hi) and the key ``length`` (None:
    no bound); c0 >= c1 when none.  The key blocks of a group that the band hides from a query
    block entirely are skipped with it."""
    first = 0 if lo is None else max(0, i0 + lo - j0)  # keys j >= i0 + lo
    stop = j1 - j0 if hi is None else min(j1 - j0, max(0, i1 + hi - j0))  # j <= i1 - 1 + hi
    if length is not None:
        stop = min(stop, max(0, length - j0))
    return first // block_k, -(-stop // block_k)


def hidden_parts(
    i0: int, i1: int, j0: int, j1: int, straddles: bool, block_q: int, offset: int | None,
    mask: np.ndarray | None, heads: slice, lo: int | None = None,
    lengths: np.ndarray | None = None, bands: np.ndarray | None = None,
) -> list[tuple[int, int, np.ndarray]] | None:
    """The entries of the rows [i0, i1) x keys [j0, j1) that may not be seen, as parts
    (a, b, hidden): the rows [a, b) (relative to i0) and a boolean array broadcastable to
    (G, b - a, j1 - j0) (:func:`hidden_entries`); [] when none is hidden, None when every entry
    is (the tile is skipped).  ``straddles``: whether the band hides some entry
    (:func:`flashlib.core.masks.band_hides` of the whole range).  Under the band alone (no
    explicit mask, no key padding) only the query blocks of ``block_q`` rows that straddle its
    edges get a part: on the causal diagonal one or two blocks of a tall group, not all of its
    rows.  bands: (G, 2) or None, as :func:`hidden_entries` (given only with key padding)."""
    if mask is None and lengths is None:
        if not straddles:
            return []
        parts = []
        for a in range(0, i1 - i0, block_q):
            b = min(a + block_q, i1 - i0)
            if band_hides(i0 + a, i0 + b, j0, j1, lo, offset):
                parts.append((a, b, hidden_entries(i0 + a, i0 + b, j0, j1, True, offset, None,
                                                   heads, lo, None)))
        return parts
    hidden = hidden_entries(i0, i1, j0, j1, straddles, offset, mask, heads, lo, lengths,
                            bands)
    if hidden is None:
        return []
    return None if hidden.all() else [(0, i1 - i0, hidden)]


def max_row_norm(x: np.ndarray) -> float:
    """The largest Euclidean norm of a row of x (..., n, d), computed in at least float32."""
    if x.size == 0:
        return 0.0
    dt = np.promote_types(x.dtype, np.float32)
    return math.sqrt(float(np.einsum("...i,...i->...", x, x, dtype=dt).max()))
