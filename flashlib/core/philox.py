"""Dropout's random numbers as a pure function of position: Philox4x32-10 in numpy.

FlashAttention never stores the dropout mask (Dao et al. 2022, Algorithms 2 and 4): the
forward pass keeps only the random generator's state, and the backward pass regenerates the
same mask tile by tile.  That needs a *counter-based* generator: the random number of entry
(i, j) is ``bits = philox(counter, key)``, a fixed function of a counter that names the entry
and of a key, with nothing carried from one number to the next, so that any tile, in any order,
on any thread, gets the same bits (Salmon et al. 2011, "Parallel random numbers: as easy as 1,
2, 3": Philox).

The layout here, and how it compares with flash-attn's:

- key = the 64-bit ``seed`` (its low and high 32-bit words), as flash-attn keys its Philox;
- counter = ``(i, j, head, offset)``: the query row, the key column, the flat (batch, head)
  index ``b * H + h`` and a per-call ``offset``.  flash-attn's ``flash::philox(seed,
  subsequence, offset)`` (csrc/flash_attn/src/philox.cuh) also puts the (row, column) of the
  entry in two counter words (``subsequence``) and folds the (batch, head) index and the thread
  into the 64-bit ``offset`` (csrc/flash_attn/src/dropout.h: ``offset + (bid * nheads + hid) *
  32 + tid % 32``), and a call's (seed, offset) come from PyTorch's generator and are saved
  for the backward as its ``rng_state``, two int64 (flash_attn/flash_attn_interface.py).  Its
  mask therefore depends on the kernel's thread layout as well as on the position; here it
  depends on the position alone, which is what lets any tiling (and the teaching function and
  its library twin) regenerate it bit for bit.
- flash-attn runs 7 rounds (6 + 1) and uses each call's 128 bits as 16 bytes, comparing each
  with ``p`` in steps of 1/256; here one call per entry, the standard 10 rounds (the rounds
  Random123's known-answer vectors check), and the first 32-bit word of the output compared
  with ``p * 2**32``: an entry is dropped with probability ``floor(p * 2**32) / 2**32``,
  within 2**-32 of p.

Why this rather than numpy's ``Philox`` bit generator: numpy's is Philox4x64, a *stream* (its
counter advances as numbers are drawn), so a tile's numbers would need one generator per
entry, keyed and advanced by hand; a dozen lines of uint64 arithmetic state the generator
itself, vectorised over a whole tile, and are checked here against Random123's
known-answer vectors (tests/core/test_philox.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["philox4x32", "dropout_keep", "drop_threshold", "ROUNDS"]

ROUNDS = 10
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # the round multipliers
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # the key schedule's increments
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def philox4x32(counter: tuple[object, object, object, object], key: tuple[object, object],
               rounds: int = ROUNDS) -> tuple[np.ndarray, ...]:
    """Philox4x32 (Salmon et al. 2011) on broadcast arrays: four 32-bit counter words and two
    32-bit key words (integers or integer arrays, each in [0, 2**32)) -> the four 32-bit
    output words, uint32 arrays of the counter's broadcast shape.

    A round multiplies two counter words by fixed constants and mixes the high and low halves
    of the 64-bit products with the other two words and the key; the key grows by two fixed
    constants between rounds.  Products of 32-bit numbers fit in uint64 exactly."""
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(c, dtype=np.uint64) for c in counter))
    k0, k1 = (np.uint64(int(k)) for k in key)
    for r in range(rounds):
        if r:  # bump the key between rounds
            k0, k1 = (k0 + _W0) & _LOW, (k1 + _W1) & _LOW
        p0, p1 = _M0 * c0, _M1 * c2  # (hi, lo) = mulhilo(M, c)
        c0, c1, c2, c3 = ((p1 >> _32) ^ c1 ^ k0, p1 & _LOW,
                          (p0 >> _32) ^ c3 ^ k1, p0 & _LOW)
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def drop_threshold(p: float) -> np.uint64:
    """The 32-bit threshold of dropout probability p in [0, 1): an entry whose random word is
    below it is dropped (probability floor(p * 2**32) / 2**32)."""
    return np.uint64(int(p * 2.0**32))


def dropout_keep(seed: int, head: object, rows: object, cols: object,
                 p: float, offset: int = 0) -> np.ndarray:
    """The dropout keep-mask of the entries (rows, cols) of head ``head``:
    True where kept.

    seed: the key, an integer in [0, 2**64); head: the flat (batch, head)
    index b * H + h; rows: query indices, cols: key indices (integers or
    integer arrays in [0, 2**32), broadcast together: rows (B_r, 1) and
    cols (B_c,) give a (B_r, B_c) tile); p: the dropout probability in
    [0, 1); offset: the call's counter word, in [0, 2**32) (flash-attn's
    per-call offset; the library passes 0 and takes a new seed per call).
    A pure function of its arguments: the same entry gets the same bit in
    every tile that holds it.
    """
    seed = int(seed)
    key = (seed & 0xFFFFFFFF, seed >> 32)  # the 64-bit seed: two words
    bits = philox4x32((rows, cols, head, offset), key)[0]  # first word
    return bits.astype(np.uint64) >= drop_threshold(p)
