"""Checkers for the chapters' exercises, one module per chapter, written in one idiom.

Each checker takes the learner's function (or answer), runs it on a set of cases including
awkward ones (huge and tiny logits, ``-inf`` scores, the empty state, float16), and returns a
:class:`Feedback` whose text says which case failed and what to try.  A checker never raises
because of the learner's code.

The idiom::

    @checker("stable softmax")                 # the title shown in the feedback
    def check_stable_softmax(fb, fn):          # fb: the Feedback; then the checker's arguments
        for name, x in cases:
            with fb.case(name):                # a LearnerError inside becomes "name: message"
                got, warns = call_learner(fn, x)   # NotImplementedError -> NotAttempted
                ...
                fb.ok(f"{name}: correct")      # or fb.fail(...)

:func:`checker` turns a learner that has not attempted the exercise (the cell's
``raise NotImplementedError``) into one "not attempted yet" line, wherever it happens;
:func:`call_learner` turns any other exception of the learner's code into a
:class:`LearnerError`, which :meth:`Feedback.case` records against the case (and
:func:`checker` against the exercise, outside any case).

Answers that call the library instead of writing the algorithm are refused: a checker names
the flashlib functions its exercise asks the learner to write (``@checker(title,
forbid=...)``, or :func:`forbidding` inside the body), and :func:`call_learner` watches the
learner's call (:func:`watching`: while the call runs, each named function's ``__code__`` is
swapped, process-wide, for a trampoline that records the calls made from outside flashlib): a
call of one of them from the learner's code becomes the problem "refused: ...", in Jupyter as
in the grader.  A warning the learner's code raised is named after where it came from
(:class:`Warned`, :func:`warned`): numpy's floating-point warnings, a module of Python's (an
unclosed ``multiprocessing`` pool's ResourceWarning), flashlib, or the learner's own code.

In the grader (grading/, ``make grade``) the learner's function runs in another process: it
reaches a checker as a handle whose calls run there; :func:`call_learner` works the same on
it.  Everything the grader and the exercises share is in one module,
flashlib.book.exercises.grader_adapter (the handle's mark, :func:`learner_side` for the GPU
chapter's kernel launches, the peak memory measured in the learner's process).

Shapes, said once for every checker: numpy's broadcast and matmul errors raised by the
learner's code are explained in words by :func:`call_learner` (:func:`broadcast_hint`: "a
row's maximum has shape (4,); keep the reduced axis with keepdims=True or [:, None] so it
broadcasts against the (4, 8) scores"), and :func:`shape_problem` says what is wrong with a
returned array's shape (a missing or extra trailing axis of 1, a transpose, lost leading
dimensions) against the shape expected.

On the website no verdict is shown: while the book is built
(:func:`flashlib.book.site.static_site`) a Feedback displays the neutral :data:`ON_THE_SITE`
line, so the page gives nothing away before the reader has tried; in Jupyter and Colab it
shows the verdict.

A checker displays its Feedback itself, as soon as it returns, whenever it runs in an IPython
kernel (Jupyter, Colab, the book's build): the verdict shows even when the call is not the
last line of its cell (``check_x(f)`` followed by ``print("done")``). The returned Feedback,
as the cell's last expression, is then not shown a second time in the same cell
(:meth:`Feedback._ipython_display_`); shown in a later cell, or printed, it shows again.

The framework, one concern per module:

flashlib.book.exercises.registry        @checker, the chapters' list, declared mistakes
flashlib.book.exercises.learner         running a learner's function (call_learner, warnings)
flashlib.book.exercises.feedback        verdict formatting (Feedback, shape and broadcast hints)
flashlib.book.exercises.refusal         refusal of library calls (forbidding, watching)
flashlib.book.exercises.memory          the memory probe (measure_peak, the grader's peak too)
flashlib.book.exercises.grader_adapter  what the grader and the exercises share
flashlib.book.exercises.variants        per-student variants (parameters drawn from the id)
flashlib.book.exercises.mistakes.NAME   each chapter's declared mistakes (mutants and hints)

The chapters' checkers, one module per chapter:

flashlib.book.exercises.intro           the Introduction
flashlib.book.exercises.overflow        The overflow problem
flashlib.book.exercises.online_softmax  Online softmax
flashlib.book.exercises.ladder          The optimisation ladder
flashlib.book.exercises.tiling          Tiling
flashlib.book.exercises.io_model        The HBM IO model
flashlib.book.exercises.masking         Masking
flashlib.book.exercises.backward        The backward pass
flashlib.book.exercises.gpu             On a real GPU (Triton kernels, run in the interpreter
                                        without a GPU)
flashlib.book.exercises.beyond          Beyond FlashAttention-1 (split-KV, grouped-query)
"""

from __future__ import annotations

from flashlib.book.exercises.feedback import (
    NOT_ATTEMPTED,
    ON_THE_SITE,
    Feedback,
    LearnerError,
    NotAttempted,
    broadcast_hint,
    fmt,
    shape_problem,
)
from flashlib.book.exercises.grader_adapter import learner_side
from flashlib.book.exercises.learner import Warned, call_learner, warned
from flashlib.book.exercises.refusal import (
    ATTENTION,
    MERGES,
    forbidding,
    library_call_problem,
    library_codes,
    library_functions,
    names,
    watching,
)
from flashlib.book.exercises.registry import CHAPTERS, Mistake, checker, declare_mistakes

__all__ = [
    "Feedback", "NotAttempted", "LearnerError", "NOT_ATTEMPTED", "ON_THE_SITE", "Warned",
    "warned", "call_learner", "checker", "CHAPTERS", "Mistake", "declare_mistakes", "forbidding",
    "names", "ATTENTION", "MERGES", "library_codes", "library_functions", "watching",
    "library_call_problem", "learner_side", "fmt", "broadcast_hint", "shape_problem",
]
