"""The Overflow chapter's picture: the safe softmax's three passes over a row in memory.
"""

from __future__ import annotations

from flashlib.book.svg import Diagram, size_text

__all__ = ["softmax_passes_diagram"]


def softmax_passes_diagram(n: int, itemsize: int) -> Diagram:
    """The safe softmax of one row of ``n`` scores of ``itemsize`` bytes: three passes over the
    row in memory (the maximum m, the sum l, then the probabilities p), and the two numbers the
    chip keeps between them."""
    row = size_text(n * itemsize)
    alt = (f"A row x of n = {n} scores ({row}) lives in memory. Pass 1 reads all of it to find "
           "the maximum m; pass 2 reads all of it again to sum exp(x - m) into l; pass 3 reads "
           "it a third time and writes the probabilities p = exp(x - m) / l. Only m and l stay "
           "on the chip between the passes.")
    caption = (f"The safe softmax reads a row of n = {n} scores ({row}) three times; the chip "
               "keeps only m and l between the passes.")
    dg = Diagram(196, alt=alt, caption=caption)
    dg.box(0, 0, 170, 170, "memory (large, slow)", fill="blue")
    dg.box(250, 0, 110, 170, "chip (fast)", fill="orange")
    dg.chip(10, 30, "x", f"n scores, {row}", w=150, h=36, fill="vermillion")
    dg.chip(10, 120, "p", f"n probabilities, {row}", w=150, h=36, fill="vermillion")
    dg.chip(270, 36, "m", "max", w=70, h=36)
    dg.chip(270, 84, "l", "sum", w=70, h=36)
    dg.arrow(162, 54, 268, 54, "1: max of x", label_y=48)
    dg.arrow(162, 98, 268, 98, "2: sum e^(x-m)", label_y=92)
    dg.arrow(268, 142, 162, 142, "3: e^(x-m) / l", label_y=136)
    dg.text(0, 190, "three reads of x, one write of p", italic=True)
    return dg
