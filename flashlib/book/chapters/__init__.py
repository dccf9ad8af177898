"""Each chapter's diagrams and widget data, one module per chapter, named as the chapter's
exercises are (:mod:`flashlib.book.exercises`): a chapter author opens one file.

=================================  =============================================================
module                             what the chapter draws
=================================  =============================================================
:mod:`~.intro`                     what lives where (standard attention, FlashAttention)
:mod:`~.overflow`                  the safe softmax's three passes
:mod:`~.online_softmax`            blocks of keys merged
:mod:`~.tiling`                    the two loop orders at one tile; the tiling widget's frames
:mod:`~.ladder`                    one tile of the fast rungs
:mod:`~.masking`                   the dropout widget's generator words
:mod:`~.backward`                  one tile of the backward; the backward widget's data
:mod:`~.precision`                 where each number is rounded; the precision widget's table
:mod:`~.io_model`                  the memory hierarchy; the IO-model widget's table
:mod:`~.gpu`                       the launch grid (diagram and widget)
:mod:`~.beyond`                    split-KV decoding; FlashAttention-3's schedules
=================================  =============================================================

A module imports only what its chapter needs (only :mod:`~.precision` needs ``ml_dtypes``);
the shared drawing primitives are in :mod:`flashlib.book.svg`.  This package imports none of
its modules: import the chapter's own, ``from flashlib.book.chapters.tiling import ...``.
"""
