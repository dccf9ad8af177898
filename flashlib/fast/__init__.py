"""The library twins of the teaching functions: batched, masked, validated, threaded.

Each function here computes what a teaching function of :mod:`flashlib.algorithms` computes,
for any batch shape, with the masks (``causal``, ``window``, ``key_lengths``, ``mask``),
grouped-query heads, careful precision and clear errors on bad input; the tests check each
one against its teaching function, a float64 reference and PyTorch.

- :mod:`flashlib.fast.softmax`   ``softmax``
- :mod:`flashlib.fast.online`    the online-softmax API: states, updates, partial states, merges
- :mod:`flashlib.fast.naive`     ``naive_attention`` and its backward (materialise S and P)
- :mod:`flashlib.fast.flash_v1`  ``flash_attention_v1`` (Algorithm 1's loop order)
- :mod:`flashlib.fast.forward`   ``flash_attention`` (FlashAttention-2's order, the fast path)
- :mod:`flashlib.fast.backward`  ``flash_attention_backward`` (recomputes P tile by tile)
- :mod:`flashlib.fast.decoding`  ``decode_attention`` (split-KV decoding: shares of the KV cache
                                 merged exactly, Flash-Decoding's schedule)
- :mod:`flashlib.fast.paged`     ``paged_decode_attention`` (decoding over a paged KV cache and
                                 its block table, split-KV over pages)
- :mod:`flashlib.fast.dropout`   dropout never stored: the path ``flash_attention(...,
                                 dropout_p=, seed=)`` and its backward take
- :mod:`flashlib.fast.tiles`     what the forward and backward fast paths share: transposed key
                                 tiles, the clamping floor, the entries a mask hides in a tile

**The options** every attention function takes (all keyword-only; each function's docstring
says only what is its own, and :func:`flashlib.core.problem.check_problem` checks them all):

q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) -> o: (..., n_q, d_v), q's dtype.
Grouped-query / multi-query attention: q (..., h_q, n_q, d) with k, v (..., h_kv, n_k, .)
and h_q a multiple of h_kv; query head h attends with K/V head h // (h_q // h_kv), as
PyTorch SDPA's ``enable_gqa=True`` does.

block_q, block_k (the tiled functions)
    the tile sizes B_r and B_c (default BLOCK_Q x BLOCK_K, measured: see
    flashlib.core.constants), honoured as given; a tile is min(block, n) on each side.
causal
    False, True / "top_left" (row i sees j <= i), "bottom_right" (j <= i + L - n_q).
mask
    boolean, broadcastable to (..., n_q, n_k); True = may attend.
window
    ``(left, right)``, a sliding window as flash-attn's ``window_size`` (None: no bound on that
    side; a bound of max(n_q, n_k) or more is none): row i sees the keys c - left <= j <= c +
    right around its diagonal key c, the call's one alignment: c = i for causal True /
    "top_left", else c = i + L - n_q (bottom-right, flash-attn's).
key_lengths
    the real keys L of each sequence (default n_k), integers indexing q's leading batch axes:
    a scalar, (B,) one per batch element (q's axis 0, also when B equals the number of heads),
    (B, H), (1, H), ...  Keys j >= L are hidden, and a bottom-right diagonal sits on the last
    real key, so padding changes no output (flash-attn's variable-length lengths,
    ``cache_seqlens``; :data:`flashlib.core.masks.ALIGNMENT_RULES`).
    All masks combine (AND); the tiled functions skip the key blocks they hide entirely.
scale
    defaults to 1/sqrt(d); kept in the compute dtype (float32 for float16 inputs).
return_lse (the forward functions)
    also return lse = m + log(l): (..., n_q), natural log, at least float32, ``-inf`` for rows
    that see no key (whose output is 0).

A backward function takes the options of its forward call (block sizes may differ).
"""

from flashlib.fast.backward import flash_attention_backward
from flashlib.fast.decoding import decode_attention
from flashlib.fast.flash_v1 import flash_attention_v1
from flashlib.fast.forward import flash_attention
from flashlib.fast.naive import naive_attention, naive_attention_backward
from flashlib.fast.paged import paged_decode_attention
from flashlib.fast.softmax import softmax

__all__ = [
    "softmax",
    "naive_attention",
    "naive_attention_backward",
    "flash_attention_v1",
    "flash_attention",
    "flash_attention_backward",
    "decode_attention",
    "paged_decode_attention",
]
