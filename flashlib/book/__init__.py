"""The book's helpers for its chapters: glued numbers, tables, figures, widgets, exercises.

Not numerics: flashlib's numeric modules never import this package (an import-linter contract
in pyproject.toml checks it).  Its dependencies are the ``book`` extra
(``pip install "flashlib[book]"``: matplotlib, ipywidgets, IPython, tabulate), each imported
only by the function that needs it.

- :mod:`flashlib.book.glue`       ``glue``, ``glued`` and ``print_glued``: numbers from code
                                  cells in the text (printed before it in the notebooks)
- :mod:`flashlib.book.tables`     ``html_table``
- :mod:`flashlib.book.plots`      the book's figure style, figures with alt text
- :mod:`flashlib.book.widgets`    ``interactive_figure``: sliders live in a kernel, static online
- :mod:`flashlib.book.chapters`   each chapter's diagrams and widget data, one module per chapter
- :mod:`flashlib.book.svg`        the diagrams' drawing primitives (``Diagram``)
- :mod:`flashlib.book.exercises`  the exercise checkers, one module per chapter
- :mod:`flashlib.book.autograd`   torch autograd as a rung of the gradient-checking ladder
                                  (optional: without torch it says so in words)
"""

from flashlib.book.glue import glue, glued, print_glued
from flashlib.book.tables import html_table

__all__ = ["glue", "glued", "print_glued", "html_table"]
