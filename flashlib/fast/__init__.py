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
