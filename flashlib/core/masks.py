"""Which keys each query may see: masks as predicates, their alignments, and their tiles.

The one owner of every mask rule: the causal alignments (:func:`causal_offset`), the band the
fast paths keep (:func:`band_bounds`, :func:`key_range`, :func:`band_hides`), the predicates the
masking chapter teaches, and the tile classes.

Conventions follow PyTorch SDPA: a boolean mask is ``True`` where a query *may* attend.  A causal
mask is a diagonal ``offset``: row ``i`` sees key ``j`` when ``j <= i + offset``, with
``offset = 0`` for the top-left alignment (SDPA's ``is_causal``) and ``offset = n_k - n_q`` for
the bottom-right one (flash-attn >= 2.1).

One alignment per call (:data:`ALIGNMENT_RULES` states it as a table, the masking chapter prints
it): every mask option of a call is placed on one diagonal.  ``causal=True`` or ``"top_left"``
puts it at ``j = i`` (the queries are the first n_q positions: SDPA); otherwise (``causal=False``
or ``"bottom_right"``) at ``j = i + L - n_q``, with ``L`` the sequence's real length,
``key_lengths[b]`` or n_k (the queries are the last n_q positions of the real keys: flash-attn's
``causal`` and ``window_size``, with its variable-length and KV-cache functions' lengths).  The
sliding window sits on that diagonal; key padding hides the keys ``j >= L``.  So padding a
sequence's keys never changes its outputs (:func:`padded` is the rule as a predicate).

The masking chapter's vocabulary (attention-gym's): a mask is a *predicate*
``visible(i, j, n_q, n_k)`` on a query index and a key index (numpy arrays broadcast), one per
concept (:func:`causal_top_left`, :func:`causal_bottom_right`, :func:`sliding_window`,
:func:`key_padding`), combined with :func:`both`.  A tile of the score matrix is *empty* (no
visible entry: skipped), *partial* (masked entry by entry) or *full* (no mask needed):
:func:`tile_class` derives it from the predicate, :func:`band_tile_class` from the two bounds
the fast path keeps (a band ``i + lo <= j <= i + hi`` and a key length), and the tests check one
against the other.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flashlib.core.checks import check_block, check_int

__all__ = [
    "causal_offset",
    "alignment",
    "ALIGNMENT_RULES",
    "check_window",
    "band_bounds",
    "sequence_bands",
    "causal_top_left",
    "causal_bottom_right",
    "sliding_window",
    "key_padding",
    "padded",
    "both",
    "dense_mask",
    "Predicate",
    "tile_class",
    "TILE_CLASSES",
    "classify_tiles",
    "band",
    "band_tile_class",
    "key_range",
    "band_hides",
    "WINDOW_CONVENTIONS",
    "window_from",
    "causal_mask",
    "visibility",
    "key_stop",
    "straddles_diagonal",
    "tile_mask",
    "causal_tiles",
]


# --- the rules: causal alignments and the band ---------------------------------------------


def causal_offset(causal: object, n_q: int, n_k: int) -> int | None:
    """The causal diagonal: row ``i`` may see key ``j`` when ``j <= i + offset``.

    ``False`` (or None) -> None (no causal mask); ``True`` or ``"top_left"`` -> 0 (PyTorch
    SDPA's ``is_causal``); ``"bottom_right"`` -> ``n_k - n_q`` (flash-attn >= 2.1).
    """
    if isinstance(causal, np.bool_):
        causal = bool(causal)
    if causal is False or causal is None:
        return None
    if causal is True or (isinstance(causal, str) and causal == "top_left"):
        return 0
    if isinstance(causal, str) and causal == "bottom_right":
        return n_k - n_q
    raise ValueError(
        f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}"
    )


def alignment(causal: object) -> str:
    """The diagonal every mask option of a call is placed on: ``"top_left"`` (j = i) when
    ``causal`` is True or "top_left", else ``"bottom_right"`` (j = i + L - n_q, L the real
    length of the sequence's keys)."""
    return "top_left" if causal_offset(causal, 0, 1) == 0 else "bottom_right"


#: The alignment rule as a table, one row per way of calling (each row a test case): the
#: arguments, the diagonal key of query row i (L: the sequence's real length, ``key_lengths[b]``
#: or n_k), the library whose convention it is.
ALIGNMENT_RULES = (
    ("causal=True or 'top_left'", "i", "PyTorch SDPA is_causal (causal_upper_left)"),
    ("causal='bottom_right'", "i + L - n_q",
     "flash-attn causal=True (>= 2.1), PyTorch causal_lower_right"),
    ("window=(left, right), causal False or 'bottom_right'", "i + L - n_q",
     "flash-attn window_size"),
    ("window=(left, right), causal=True or 'top_left'", "i", "Transformers sliding_window"),
    ("key_lengths=L", "moves the bottom-right diagonal to the last real key",
     "flash-attn cu_seqlens, flash_attn_with_kvcache cache_seqlens"),
)


def check_window(window: object) -> tuple[int | None, int | None] | None:
    """A sliding window ``(left, right)``: each a non-negative integer of any size (Python or
    numpy) or None (no bound)."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of non-negative integers "
                        f"or None, got {window!r}")
    left, right = (None if w is None else check_int(w, f"window[{a}]", minimum=0)
                   for a, w in enumerate(window))
    return left, right


def band_bounds(causal: object, window: object, n_q: int,
                n_k: int) -> tuple[int | None, int | None]:
    """(lo, hi): row i sees keys i + lo <= j <= i + hi (None: no bound), the causal mask AND
    the sliding window ``(left, right)`` on the call's one diagonal j = i + c
    (:func:`alignment`): c = 0 for ``causal`` True/"top_left", else c = n_k - n_q (flash-attn's
    ``window_size``).  lo = c - left, hi = min(causal offset, c + right).  A window bound of
    max(n_q, n_k) or more hides no key, whatever its size: it is no bound (None), so that no
    arithmetic on it can overflow."""
    hi = causal_offset(causal, n_q, n_k)
    checked = check_window(window)
    if checked is None:
        return None, hi
    widest = max(n_q, n_k)
    left, right = (None if w is None or w >= widest else w for w in checked)
    diagonal = 0 if alignment(causal) == "top_left" else n_k - n_q
    lo = None if left is None else diagonal - left
    if right is not None:
        hi = diagonal + right if hi is None else min(hi, diagonal + right)
    return lo, hi


def sequence_bands(
    causal: object, window: object, n_q: int, n_k: int, lengths: np.ndarray | None,
) -> tuple[int | None, int | None, np.ndarray | None]:
    """The band of every sequence when the keys of some are padded: ``(lo, hi, bands)``.

    lengths: None or (B,) integers in [0, n_k], each sequence's real keys.  A bottom-right
    band (:func:`alignment`) is placed on each sequence's real length L_b: sequence b's band
    is :func:`band_bounds` with n_k = L_b, the band of its unpadded self.  Then ``bands`` is
    (B, 2) int64, (lo_b, hi_b) per sequence (a side without bound holds -n_q or n_k, which
    hide nothing), and lo, hi their loosest values (the union, for skipping tiles); else
    ``bands`` is None and lo, hi are :func:`band_bounds`'s, the same for every sequence.
    """
    lo, hi = band_bounds(causal, window, n_q, n_k)
    if (lengths is None or (lo is None and hi is None) or alignment(causal) == "top_left"
            or bool((lengths == n_k).all())):
        return lo, hi, None
    shift = lengths.astype(np.int64) - n_k  # <= 0: the diagonal moves left with the length
    bands = np.stack([shift + (-n_q if lo is None else lo), shift + (n_k if hi is None else hi)],
                     axis=-1)
    return (None if lo is None else int(bands[:, 0].min()),
            None if hi is None else int(bands[:, 1].max()), bands)


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


def visibility(
    n_q: int, n_k: int, offset: int | np.ndarray | None, mask: np.ndarray | None,
    lo: int | np.ndarray | None = None, key_lengths: np.ndarray | None = None,
) -> np.ndarray | None:
    """The full visibility matrix (..., n_q, n_k) of the causal diagonal (or a window's right
    edge) ``offset``, the window's left edge ``lo``, the key padding ``key_lengths`` (already
    shaped batch_shape + (1, 1)) AND ``mask``.  ``offset`` and ``lo`` are integers, or arrays
    shaped batch_shape + (1, 1) for a band per sequence (:func:`sequence_bands`).

    Returns None when every key is visible.  Materialises n_q x n_k booleans: only the naive
    path uses it.
    """
    visible = mask
    if offset is not None:  # booleans only: no (n_q, n_k) array of integers
        tri = _diagonal(0, n_q, 0, n_k, offset)
        visible = tri if visible is None else visible & tri
    if lo is not None:
        inside = np.arange(n_k)[None, :] >= np.arange(n_q)[:, None] + lo
        visible = inside if visible is None else visible & inside
    if key_lengths is not None:
        real = np.arange(n_k) < key_lengths  # batch_shape + (1, n_k)
        visible = real if visible is None else visible & real
    return visible


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


# --- masks as predicates: row (query) i, column (key) j; n_q queries, n_k keys ----------------


Predicate = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]


def causal_top_left(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
    """Row i sees key j when j <= i: PyTorch SDPA's ``is_causal`` (``causal_upper_left``)."""
    return j <= i


def causal_bottom_right(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
    """Row i sees key j when j <= i + n_k - n_q: the last query sees the last key (flash-attn
    >= 2.1's ``causal=True``, PyTorch's ``causal_lower_right``): decoding with a KV cache."""
    return j <= i + (n_k - n_q)


def sliding_window(left: int | None, right: int | None,
                   align: str = "bottom_right") -> Predicate:
    """Row i sees the keys from ``left`` before its diagonal to ``right`` after it, both
    inclusive (None: no bound), as flash-attn's ``window_size=(left, right)``.  The diagonal
    is j = i + n_k - n_q (``align="bottom_right"``, flash-attn's) or j = i ("top_left")."""
    left, right = check_window((left, right))  # integers >= 0 of any size, or None
    _check_align(align)

    def visible(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
        c = i + (n_k - n_q if align == "bottom_right" else 0)  # the diagonal key of row i
        not_too_old = True if left is None else c - j <= left
        not_too_new = True if right is None else j - c <= right
        return not_too_old & not_too_new
    return visible


def _check_predicate(visible: object, name: str = "visible") -> None:
    if not callable(visible):
        raise TypeError(f"{name} must be a mask predicate visible(i, j, n_q, n_k) (e.g. "
                        f"causal_top_left, sliding_window(4, 0)), got {visible!r}")


def _check_align(align: object) -> None:
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")


def key_padding(length: int) -> Predicate:
    """A sequence padded to n_k keys: only its first ``length`` keys are real, j < length."""
    length = check_int(length, "length", minimum=0)

    def visible(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
        return j < length
    return visible


def padded(visible: Predicate, length: int) -> Predicate:
    """``visible`` for a sequence of ``length`` real keys padded to n_k keys: the mask of its
    unpadded self (a bottom-right diagonal on its last real key) AND no padded key.  What the
    library's ``key_lengths=`` means: padding keys changes no output."""
    _check_predicate(visible)
    length = check_int(length, "length", minimum=0)

    def masked(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
        return visible(i, j, n_q, length) & (j < length)
    return masked


def both(*masks: Predicate) -> Predicate:
    """The combination of masks: a key is visible when every one of ``masks`` lets it be."""
    for a, mask in enumerate(masks):
        _check_predicate(mask, f"masks[{a}]")

    def visible(i: np.ndarray, j: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
        out = np.ones(np.broadcast_shapes(np.shape(i), np.shape(j)), dtype=bool)
        for mask in masks:
            out = out & mask(i, j, n_q, n_k)
        return out
    return visible


def dense_mask(visible: Predicate, n_q: int, n_k: int) -> np.ndarray:
    """The token-level truth: the predicate at every (i, j), a boolean (n_q, n_k) array."""
    _check_predicate(visible)
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return np.broadcast_to(visible(i, j, n_q, n_k), (n_q, n_k)).copy()


def tile_class(visible: Predicate, i0: int, i1: int, j0: int, j1: int, n_q: int,
               n_k: int) -> str:
    """``"empty"`` (no visible entry: skip the tile), "full" (every entry visible: no mask) or
    "partial" (mask entry by entry) for rows [i0, i1) x keys [j0, j1), from the predicate."""
    tile = visible(np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :], n_q, n_k)
    tile = np.broadcast_to(tile, (i1 - i0, j1 - j0))
    return "empty" if not tile.any() else "full" if tile.all() else "partial"


#: The codes :func:`classify_tiles` returns, in its order.
TILE_CLASSES = ("empty", "partial", "full")


def classify_tiles(visible: Predicate, n_q: int, n_k: int, B_r: int, B_c: int) -> np.ndarray:
    """(T_r, T_c) integer array: the index in :data:`TILE_CLASSES` of every B_r x B_c tile
    (a last tile is shorter when B_r or B_c does not divide n_q or n_k)."""
    _check_predicate(visible)
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    B_r, B_c = check_block(B_r, "B_r"), check_block(B_c, "B_c")
    rows, cols = range(0, n_q, B_r), range(0, n_k, B_c)
    return np.array([[TILE_CLASSES.index(tile_class(visible, i0, min(i0 + B_r, n_q), j0,
                                                    min(j0 + B_c, n_k), n_q, n_k))
                      for j0 in cols] for i0 in rows], dtype=np.int64).reshape(len(rows),
                                                                                len(cols))


# --- the same masks as the fast path keeps them: a band and a key length ----------------------


def band(n_q: int, n_k: int, causal: bool | str = False,
         window: tuple[int | None, int | None] | None = None,
         length: int | None = None) -> tuple[int | None, int | None]:
    """(lo, hi): row i sees keys i + lo <= j <= i + hi (None: no bound) under the causal mask
    ``causal`` (False, True / "top_left", "bottom_right") AND the sliding ``window=(left,
    right)`` (None: no window) on the call's one diagonal (:func:`band_bounds`), for a sequence
    whose first ``length`` keys are real (None: all n_k; :func:`sequence_bands`)."""
    n_q, n_k = check_int(n_q, "n_q", minimum=0), check_int(n_k, "n_k", minimum=0)
    if length is None:
        return band_bounds(causal, window, n_q, n_k)
    length = check_int(length, "length", minimum=0)
    if length > n_k:
        raise ValueError(f"length must lie in [0, n_k = {n_k}], got {length}")
    lo, hi, _ = sequence_bands(causal, window, n_q, n_k, np.array([length]))
    return lo, hi


def band_tile_class(i0: int, i1: int, j0: int, j1: int, lo: int | None, hi: int | None,
                    length: int | None = None) -> str:
    """The class of a tile from the band (lo, hi) and the key ``length`` alone, in O(1):
    what the fast path uses, tested equal to :func:`tile_class` on the dense predicate."""
    start, stop = key_range(i0, i1, j1, lo, hi, length)
    if lo is not None and hi is not None and lo > hi:
        return "empty"
    if max(start, j0) >= stop:
        return "empty"
    padded = length is not None and j1 > length
    return "partial" if padded or band_hides(i0, i1, j0, j1, lo, hi) else "full"


def key_range(i0: int, i1: int, n_k: int, lo: int | None, hi: int | None,
              length: int | None = None) -> tuple[int, int]:
    """[start, stop): the keys that some row of [i0, i1) may see under the band (lo, hi) and
    the key ``length`` (None: n_k); start >= stop when none.  Key blocks outside are skipped."""
    stop = n_k if length is None else min(n_k, length)
    if hi is not None:
        stop = min(stop, i1 - 1 + hi + 1)
    start = 0 if lo is None else max(0, i0 + lo)
    return start, max(stop, 0)


def band_hides(i0: int, i1: int, j0: int, j1: int, lo: int | None, hi: int | None) -> bool:
    """True when the band hides some entry of the tile rows [i0, i1) x keys [j0, j1): its
    top-right corner lies above the upper bound or its bottom-left corner below the lower one."""
    return (hi is not None and j1 - 1 > i0 + hi) or (lo is not None and j0 < i1 - 1 + lo)


# --- conventions: one sliding window, three libraries' words ---------------------------------


#: How three libraries write a sliding window of parameter ``w`` (each row a test case):
#: (library, how it is written, the rule it applies to query i and key j, our (left, right),
#: our alignment).  "W tokens including the current one" is flash-attn (W - 1, 0),
#: Transformers W, attention-gym W - 1.
WINDOW_CONVENTIONS = (
    ("flash-attn", "window_size=(w, 0)",
     "i + n_k - n_q - w <= j <= i + n_k - n_q", lambda w: (w, 0), "bottom_right"),
    ("Transformers", "sliding_window=w",
     "i - w < j <= i", lambda w: (w - 1, 0), "top_left"),
    ("attention-gym", "generate_sliding_window(w)",
     "0 <= i - j <= w", lambda w: (w, 0), "top_left"),
)


def window_from(library: str, w: int) -> Predicate:
    """The predicate of the sliding window that ``library`` (a row of
    :data:`WINDOW_CONVENTIONS`) writes with parameter ``w`` (Transformers' at least 1)."""
    for name, _, _, left_right, align in WINDOW_CONVENTIONS:
        if name == library:
            w = check_int(w, "w", minimum=1 if name == "Transformers" else 0)
            return sliding_window(*left_right(w), align=align)
    names = ", ".join(row[0] for row in WINDOW_CONVENTIONS)
    raise ValueError(f"library must be one of {names}, got {library!r}")
