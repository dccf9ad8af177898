"""Each chapter's declared mistakes (flashlib.book.exercises.registry.Mistake): the wrong
answers its checkers must catch, each with the hint it must produce, one module per chapter
(imported by registry.declared_mistakes, never by a chapter).  A mistake is what a learner
hands in, so each module reads like learner code: no flashlib function the exercise forbids
(a learner's copy of it instead, registry.learner_copy).

Not installed with the package (pyproject.toml excludes it): many mistakes are a right answer
with one change, and a learner's installed flashlib must not hold right answers the exercises
do not forbid; the grader's sandbox hides the folder and its lint flags an import of it.
Without it, registry.declared_mistakes finds none."""
