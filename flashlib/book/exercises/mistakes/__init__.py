"""Each chapter's declared mistakes (flashlib.book.exercises.registry.Mistake): the wrong
answers its checkers must catch, each with the hint it must produce, one module per chapter
(imported by registry.declared_mistakes, never by a chapter).  A mistake is what a learner
hands in, so each module reads like learner code: numpy only, no flashlib function the
exercise forbids."""
