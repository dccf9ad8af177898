"""flashlib: the numerics of "FlashAttention from Scratch", in layers you can see in the tree.

Open :mod:`flashlib.algorithms` first: the book's algorithms as the papers write them, in book
order.  Then:

=========================  ==================================================================
layer                      what
=========================  ==================================================================
``flashlib.algorithms``    the teaching functions: one head, plain numpy, the papers' names
``flashlib.fast``          their library twins: batched, masked, validated, threaded
``flashlib.studies``       each chapter's experiments (counts, tables, sweeps), numpy only
``flashlib.core``          the ground floor: the HBM memory model, the mask rules, the input
                           checks, constants, threads, the accuracy rule, measuring
``flashlib.book``          the chapters' helpers: glue, tables, figures, widgets, exercises
``flashlib.bench``         the benchmark (``python -m flashlib.bench``)
``flashlib.gpu``           the Triton kernels, flash-attn and PyTorch SDPA on a GPU
=========================  ==================================================================

Each layer imports only the layers below it (``book`` and ``bench`` above ``studies`` and
``gpu``, above ``fast`` and ``algorithms``, above ``core``); one import-linter contract
(pyproject.toml) keeps it so.  The numeric layers (``core``, ``algorithms``, ``fast``,
``studies``) need numpy only (``studies.precision`` also ``ml_dtypes``).

Names follow one rule: a **teaching function** is named after the paper's algorithm and acts
on one head (``flash2_forward``: FlashAttention-2's forward pass); its **library twin** is named
after what a caller asks for and takes batches and keyword options (``flash_attention``).

=============================  ==============================  ===============================
paper                          teaching (flashlib.algorithms)  library twin
=============================  ==============================  ===============================
safe softmax                   ``safe_softmax``                ``softmax``
online softmax, one step       ``online_update``               ``online_softmax_update`` [1]
... one row, key by key        ``online_attention_row``        ``partial_attention`` [1]
merge of two partial states    ``merge_states``                ``merge_partials`` [1]
standard attention (Alg. 0)    ``standard_attention``          ``naive_attention``
its backward (Alg. 3)          ``standard_attention_backward``  ``naive_attention_backward``
FlashAttention (Alg. 1)        ``flash1_forward``              ``flash_attention_v1``
FlashAttention backward (Alg.  ``flash1_backward``             (FA-2's backward:
4)                                                             ``flash_attention_backward``)
FlashAttention-2 forward       ``flash2_forward``              ``flash_attention``
... with a mask                ``masked_flash_forward``        ``flash_attention(causal=...)``
FlashAttention-2 backward      ``flash2_backward``             ``flash_attention_backward``
... in two passes              ``two_pass_backward``           ``flash_attention_backward``
dropout, never stored          ``flash2_dropout_forward``,     ``flash_attention(dropout_p=,
(Alg. 2 and 4)                 ``flash2_dropout_backward``     seed=)`` and its backward
split-KV decoding              ``split_kv_decode``             ``decode_attention`` [2]
paged KV cache                 ``paged_kv_decode``             ``paged_decode_attention`` [3]
grouped-query attention        ``grouped_query_attention``     ``flash_attention`` (k, v with
                                                               fewer heads than q)
=============================  ==============================  ===============================

[1] in :mod:`flashlib.fast.online`; [2] in :mod:`flashlib.fast.decoding` (it computes what
``flash_attention`` computes, in Flash-Decoding's schedule: the root API keeps one function per
result); [3] in :mod:`flashlib.fast.paged`; every other twin is in the root API below.  The
teaching functions check nothing; call their twins, which refuse bad input by name.

The public API below is the library: what a program that only wants attention imports.
"""

from flashlib.core.masks import causal_mask
from flashlib.fast import (
    flash_attention,
    flash_attention_backward,
    flash_attention_v1,
    naive_attention,
    naive_attention_backward,
    softmax,
)

__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "naive_attention",
    "naive_attention_backward",
    "flash_attention_v1",
    "softmax",
    "causal_mask",
]

__version__ = "0.2.0"  # the one place the version is set (pyproject.toml reads it)
