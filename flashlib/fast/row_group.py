"""The forward's running-maximum path: one group of query rows streaming its key blocks.

:class:`RowGroup` is the inner loop of :func:`flashlib.flash_attention` when the scores are not
bounded enough to skip the running maximum (:mod:`flashlib.fast.bounded` is the path that
skips it).  A group is G heads x R query rows, R up to GROUP_TILES query blocks of B_r rows; it
keeps the paper's running state per row, ``m_i`` (base 2), ``l_i`` and the unnormalised
``acc``, and meets each key block with one of four steps, cheapest first:

- :meth:`RowGroup.plain_step`  every row, a whole key block, nothing hidden, every ``m_i``
  known: ``[Q_i, -m_i] @ [K_j^T; 1] = S_ij - m_i`` (the maximum rides in the matmul), one
  ``exp2``, the row sums as ``P @ 1``, five numpy calls;
- :meth:`RowGroup.first_step`  the first key block of a query block, nothing hidden: ``m_i``
  is the tile's row maximum, taken on S^T (a fast reduction);
- :meth:`RowGroup.stale_step`  any other tile against the stale ``m_i``; when a row sum
  grows past :data:`STALE_LIMIT`, :meth:`RowGroup.move_max` moves ``m_i`` up by a power of
  two (exact rescaling);
- :meth:`RowGroup.exact_step`  masked entries to -inf, the true new maximum, the rescaling of
  Algorithm 1: after an overflow, and whenever a row has seen no key yet.

Names: the papers' B_r and B_c are the API's ``block_q`` and ``block_k``; inside
``flashlib.fast`` ``b_r`` and ``b_c`` are the tiles actually used, ``min(block, n)``, and a
group's height (several query blocks) is ``rows``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from flashlib.core.constants import LN2
from flashlib.core.masks import band_hides, key_range
from flashlib.fast.tiles import (
    SHORT_ROWS,
    TileCall,
    exp_floor,
    hidden_parts,
    row_max,
    rows_seeing,
    split_rows,
)

__all__ = ["STALE_LIMIT", "HEADROOM", "Tiles", "Hiding", "RowGroup"]


#: Conditional rescaling: a tile computed against a stale running maximum m_i is accepted while
#: each row's sum of exp2(s - m_i) stays at most 2**16.  Then every term is at most 2**16, far
#: from float32's overflow at 2**128, and the result equals the always-rescaled one up to
#: rounding.  A larger finite sum moves m_i up by the power of two just above it (acc and l_i
#: are scaled by its inverse, exactly); an overflow to inf sends the tile through the exact
#: step, which updates m_i from the tile's maximum and rescales the accumulator.
STALE_LIMIT = 2.0**16


#: When a row sum exceeds STALE_LIMIT, m_i moves up past the row maximum by this much more (base
#: 2): the row's terms are then at most 2**-HEADROOM, so that large logits, whose maximum keeps
#: growing, cross the limit again less often.  The terms stay far above the clamping floor
#: (2**-63 in float32), so nothing that matters is clamped.
HEADROOM = 16


class Tiles(NamedTuple):
    """One worker's buffers for a group of up to G heads x R query rows (sliced to the group's
    size)."""

    q_aug: np.ndarray  # (G, R, d + 1): [Q_i * scale * log2(e), -m_i]
    s: np.ndarray  # (G, R, B_c): the score tiles, then P~ in place
    s_t: np.ndarray | None  # (G, B_c, R): S^T of a first tile, and the tiles transposed for
    #                         row maxima (None when one tile exceeds TILE_BYTES)
    pv: np.ndarray  # (G, R, d_v): one key block's P~ V
    rows: np.ndarray  # (G, R, 1): one key block's row sums
    ones: np.ndarray  # (B_c, 1)
    ones_t: np.ndarray  # (1, B_c)
    floors: np.ndarray | None  # (G, R, B_c) of the clamping floor, when clamping may be


class Hiding(NamedTuple):
    """What may hide keys from the group's rows: the causal diagonal (row i sees j <= i +
    offset), the window's left edge (j >= i + lo), the key padding (``lengths`` (G,)), each
    sequence's own band (``bands`` (G, 2)), an explicit ``mask`` (of all heads; ``heads`` picks
    the group's)."""

    offset: int | None
    lo: int | None
    lengths: np.ndarray | None
    bands: np.ndarray | None
    mask: np.ndarray | None
    heads: slice

    @property
    def plain(self) -> bool:
        """No padding and no explicit mask (the band alone may hide keys)."""
        return self.mask is None and self.lengths is None


class _Part(NamedTuple):
    """Rows [r0, r1) of the group's buffers and running state, w keys wide, with their BLAS
    calls laid out."""

    s: np.ndarray  # (G, r1 - r0, w)
    s_t: np.ndarray | None  # (G, w, r1 - r0)
    q_i: np.ndarray  # (G, r1 - r0, d + 1)
    m_i: np.ndarray  # (G, r1 - r0)
    l_i: np.ndarray
    acc: np.ndarray  # (G, r1 - r0, d_v)
    pv: np.ndarray
    rows: np.ndarray  # (G, r1 - r0, 1)
    l_tile: np.ndarray  # (G, r1 - r0): rows[..., 0]
    qk: TileCall  # q_i @ k_j -> s
    qk_exact: TileCall  # q_i[..., :d] @ k_j[:, :d] -> s
    pv_call: TileCall  # s @ v_j -> pv


class RowGroup:
    """The running state of one group of query rows, and the steps that fold a key block in.

    q_aug: (G, R, d + 1): rows of Q times scale * log2(e) (times scale alone with
    ``exp=np.exp``, the natural-units fallback); the last column is kept at -m_i here.
    k_tiles: (G, n_k / B_c, d + 1, B_c): contiguous tiles of K^T with a last row of ones, so
    that q_aug @ k_tiles[:, t] = S - m_i.  v: (G, n_k, d_v).  buf: this worker's tiles.
    exp: np.exp2 (base 2) or np.exp; clamp: whether scores may fall below the floor of
    ``exp`` (then tiles whose minimum does are clamped to it); v_bound: max |v|, to tell when
    the accumulator could overflow.
    """

    def __init__(self, q_aug: np.ndarray, k_tiles: np.ndarray, v: np.ndarray, buf: Tiles,
                 exp: np.ufunc = np.exp2, clamp: bool = False, v_bound: float = 1.0) -> None:
        g, rows = q_aug.shape[:2]
        self.q_aug, self.k_tiles, self.v, self.buf = q_aug, k_tiles, v, buf
        self.exp, self.clamp, self.v_bound = exp, clamp, v_bound
        self.d, self.b_c = q_aug.shape[2] - 1, k_tiles.shape[-1]
        dtype = q_aug.dtype
        self.floor = exp_floor(dtype, exp)
        self.acc_limit = float(np.finfo(dtype).max) / 4
        self.m = np.full((g, rows), -np.inf, dtype=dtype)  # running max, units of exp
        self.l = np.zeros((g, rows), dtype=dtype)  # running sum of exp(s - m_i)  # noqa: E741
        self.acc = np.zeros((g, rows, v.shape[-1]), dtype=dtype)  # ... times v_j
        self.parts: dict[tuple[int, int, int], _Part] = {}
        self._whole_operands()

    def _whole_operands(self) -> None:
        """The plain step's operands as blocks of rows for BLAS (:func:`split_rows`), laid out
        once; ``self.split`` False when they cannot be (large d, a partial block, V with
        unusual strides)."""
        buf, q_aug, v = self.buf, self.q_aug, self.v
        g, rows, b_c, d_v = q_aug.shape[0], q_aug.shape[1], self.b_c, v.shape[-1]
        self.s_all, self.pv_all = buf.s[:g, :rows, :b_c], buf.pv[:g, :rows]
        self.rows_all = buf.rows[:g, :rows]
        qk, pv = TileCall(self.s_all, q_aug.shape[-1]), TileCall(self.pv_all, b_c)
        self.split = (qk.mode == pv.mode == "rows" and qk.rows == pv.rows
                      and v.strides[-2:] == (d_v * v.itemsize, v.itemsize))
        if self.split:
            whole_keys = v.shape[-2] // b_c * b_c
            self.q_b, self.s_b, self.pv_b = split_rows(q_aug, qk.rows), qk.blocks, pv.blocks
            self.p_b = split_rows(self.s_all, qk.rows)
            self.k_b = self.k_tiles[:, :, None]  # (G, n_k / B_c, 1, d + 1, B_c)
            self.v_b = v[:, :whole_keys].reshape(v.shape[0], -1, 1, b_c, d_v)  # K/V heads

    def part(self, r0: int, r1: int, w: int) -> _Part:
        """Rows [r0, r1) of the group, w keys wide (laid out once per shape)."""
        got = self.parts.get((r0, r1, w))
        if got is None:
            buf, g = self.buf, self.q_aug.shape[0]
            s, pv, rows = buf.s[:g, r0:r1, :w], buf.pv[:g, r0:r1], buf.rows[:g, r0:r1]
            s_t = None if buf.s_t is None else buf.s_t[:g, :w, r0:r1]
            got = self.parts[r0, r1, w] = _Part(
                s, s_t, self.q_aug[:, r0:r1], self.m[:, r0:r1], self.l[:, r0:r1],
                self.acc[:, r0:r1], pv, rows, rows[..., 0], TileCall(s, self.d + 1),
                TileCall(s, self.d), TileCall(pv, w))
        return got

    def plain_step(self, t: int) -> bool:
        """Key block t against every row, nothing hidden, every m_i known: S - m_i from the
        matmul, P~, its row sums and P~ V.  True when the tile is folded in; False when a row
        sum passed STALE_LIMIT (the tile is left computed in the buffers for
        :meth:`stale_step`)."""
        s = self.s_all
        np.matmul(self.q_b, self.k_b[:, t], out=self.s_b)  # S_ij - m_i
        if self.clamp:
            np.maximum(s, self.buf.floors[: s.shape[0], : s.shape[1], : s.shape[2]], out=s)
        self.exp(s, out=s)
        np.matmul(s, self.buf.ones, out=self.rows_all)
        np.matmul(self.p_b, self.v_b[:, t], out=self.pv_b)
        l_tile = self.rows_all[..., 0]
        if l_tile.max() <= STALE_LIMIT:
            self.l += l_tile
            self.acc += self.pv_all
            return True
        return False

    def first_step(self, part: _Part, k_j: np.ndarray, v_j: np.ndarray) -> None:
        """The first key block of these query blocks, every entry visible: m_i starts as the
        tile's row maximum, taken on S^T (keys along the rows, where numpy's max is an
        elementwise max of contiguous rows: several times faster than reducing the tile's short
        rows); P^T goes into P V as a transposed operand, and the row sums are 1^T P^T."""
        d, s_t = self.d, part.s_t
        np.matmul(k_j[:, :d].swapaxes(-1, -2), part.q_i[..., :d].swapaxes(-1, -2), out=s_t)
        m_new = s_t.max(axis=-2)
        s_t -= m_new[:, None, :]
        if self.clamp and s_t.min() < self.floor:
            np.maximum(s_t, self.floor, out=s_t)
        self.exp(s_t, out=s_t)  # P~^T
        np.matmul(self.buf.ones_t[:, : s_t.shape[1]], s_t, out=part.l_i[:, None, :])
        part.acc[...] += part.pv_call(s_t.swapaxes(-1, -2), v_j)
        part.m_i[...] = m_new
        part.q_i[..., d] = -m_new

    def stale_step(self, part: _Part, k_j: np.ndarray, v_j: np.ndarray, hidden: list,
                   computed: bool) -> bool:
        """[Q_i, -m_i] @ [K_j^T; 1] = S_ij - m_i against the stale m_i, one exp, one row sum
        (``computed``: already done by :meth:`plain_step`).  True when the tile is folded in
        (moving m_i up if a row sum grew large); False after an overflow (redo it exactly)."""
        s = part.s
        if not computed:
            part.qk(part.q_i, k_j)
            if self.clamp:  # no subnormal exp2 results (slow path): one pass
                r0 = part.q_i.shape[1]  # (the floors' rows: any, they are all equal)
                np.maximum(s, self.buf.floors[: s.shape[0], :r0, : s.shape[2]], out=s)
            self.exp(s, out=s)  # P~_ij against the stale m_i, in place (inf on overflow)
            for a, b, h in hidden:
                np.copyto(s[:, a:b], 0, where=h)
            np.matmul(s, self.buf.ones[: s.shape[2]], out=part.rows)  # row sums, l_tile
            part.pv_call(s, v_j)
        if part.l_tile.max() <= STALE_LIMIT:  # False for inf and NaN too
            part.l_i[...] += part.l_tile
            part.acc[...] += part.pv
            return True
        l_new = part.l_i + part.l_tile
        if (l_new * self.v_bound <= self.acc_limit).all():  # finite; acc + pv cannot overflow
            part.acc[...] += part.pv
            part.l_i[...] = l_new
            self.move_max(part)
            return True
        return False

    def move_max(self, part: _Part) -> None:
        """Some row sum grew past STALE_LIMIT: move those rows' m_i up by the power of two 2**e
        > l_i, and by HEADROOM more, so that the next tiles exceed the limit less often."""
        l_i, m_i, acc = part.l_i, part.m_i, part.acc
        big = np.nonzero(l_i > STALE_LIMIT)  # those rows only (few, usually)
        dtype = l_i.dtype
        e = (np.frexp(l_i[big])[1] + HEADROOM).astype(dtype)
        m_old = m_i[big]
        m_new = m_old + (e if self.exp is np.exp2 else e * dtype.type(LN2))
        alpha = self.exp(m_old - m_new)  # 2**-e (as m_new was rounded)
        l_i[big] *= alpha
        acc[big] *= alpha[:, None]
        m_i[big] = m_new
        part.q_i[..., self.d][big] = -m_new

    def exact_step(self, part: _Part, k_j: np.ndarray, v_j: np.ndarray, hidden: list) -> None:
        """S_ij, masked entries to -inf, the new maximum, the accumulator rescaled (Algorithm
        1's step).  Rows that have seen no visible key keep m = -inf and are exponentiated
        against 0, so that exp(-inf - (-inf)) never produces a NaN."""
        s, m_i, l_i, acc = part.s, part.m_i, part.l_i, part.acc
        w = s.shape[2]
        part.qk_exact(part.q_i[..., : self.d], k_j[:, : self.d])
        for a, b, h in hidden:
            np.copyto(s[:, a:b], -np.inf, where=h)
        m_new = np.maximum(m_i, row_max(s, self.buf.s_t if self.b_c <= SHORT_ROWS else None))
        m_ref = np.where(np.isneginf(m_new), 0, m_new)
        s -= m_ref[..., None]
        if hidden or (self.clamp and s.min() < self.floor):
            # -inf and subnormal results take a slow path
            floors = self.buf.floors
            np.maximum(s, self.floor if floors is None
                       else floors[: s.shape[0], : s.shape[1], :w], out=s)
        self.exp(s, out=s)  # P~_ij, in place
        for a, b, h in hidden:
            np.copyto(s[:, a:b], 0, where=h)
        alpha = self.exp(m_i - m_ref)  # rescales what was accumulated against the old max
        l_i *= alpha
        np.matmul(s, self.buf.ones[:w], out=part.rows)
        l_i += part.l_tile
        acc *= alpha[..., None]
        part.pv_call(s, v_j)
        acc += part.pv
        m_i[...] = m_new
        part.q_i[..., self.d] = -m_ref

    def run(self, i0: int, B_r: int, hide: Hiding) -> tuple:
        """Fold in every key block that the rows [i0, i0 + R) may see,
        in query blocks of B_r rows.  Returns acc (G, R, d_v), l_i and
        m_i (G, R), m_i in the units of ``exp``."""
        R, n_k, B_c = self.q_aug.shape[1], self.v.shape[-2], self.b_c
        i1, lo, top = i0 + R, hide.lo, hide.offset
        # per query block: every m_i of its rows is known (finite), so
        # that -m_i may ride in the matmul; and no key block met yet
        known = [False] * -(-R // B_r)
        fresh = [True] * len(known)
        ready = False  # every block's m_i known
        last = None if hide.lengths is None else int(hide.lengths.max())
        start, stop = key_range(i0, i1, n_k, lo, top, last)
        step = max(B_c, 1)  # (no keys: B_c = 0, and no step)
        for j0 in range(start - start % step, stop, step):
            t, j1 = j0 // step, min(j0 + B_c, n_k)
            r0, r1 = rows_seeing(i0, i1, j0, j1, B_r, lo, top)
            if r0 >= r1:
                continue  # the band hides the key block from every row
            w, computed = j1 - j0, False
            whole = r1 - r0 == R and w == B_c
            if (ready and hide.plain and self.split and whole
                    and not band_hides(i0, i1, j0, j1, lo, top)):
                if self.plain_step(t):
                    continue
                computed = True  # a row sum grew large: the stale step
            part = self.part(r0, r1, w)
            k_j, v_j = self.k_tiles[:, t, :, :w], self.v[:, j0:j1]
            hidden = self.hidden(i0 + r0, i0 + r1, j0, j1, B_r, hide)
            if hidden is None:
                continue  # the mask or the padding hides the whole tile
            blocks = range(r0 // B_r, -(-r1 // B_r))
            if (not hidden and part.s_t is not None and not ready
                    and all(fresh[b] for b in blocks)):
                self.first_step(part, k_j, v_j)
                for b in blocks:
                    fresh[b], known[b] = False, True
                ready = all(known)
                continue
            if ((ready or all(known[b] for b in blocks)) and
                    self.stale_step(part, k_j, v_j, hidden, computed)):
                continue
            self.exact_step(part, k_j, v_j, hidden)
            seen = ~np.isneginf(part.m_i)
            for b in blocks:
                fresh[b] = False
                rows = seen[:, b * B_r - r0: (b + 1) * B_r - r0]
                known[b] = bool(rows.all())
            ready = all(known)
        return self.acc, self.l, self.m

    @staticmethod
    def hidden(i0: int, i1: int, j0: int, j1: int, B_r: int, hide: Hiding) -> list | None:
        """The entries of rows [i0, i1) x keys [j0, j1) that ``hide`` hides, by query block
        (:func:`hidden_parts`): [] for none, None for all."""
        straddles = band_hides(i0, i1, j0, j1, hide.lo, hide.offset)
        return hidden_parts(i0, i1, j0, j1, straddles, B_r, hide.offset, hide.mask,
                            hide.heads, hide.lo, hide.lengths, hide.bands)
