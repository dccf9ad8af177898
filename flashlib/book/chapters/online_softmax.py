"""The Online softmax chapter's picture: blocks of keys, each with its own state (m, l, acc),
merged in any order.
"""

from __future__ import annotations

from flashlib.book.svg import Diagram

__all__ = ["merge_diagram"]


def merge_diagram(n_k: int, block: int) -> Diagram:
    """One query row's ``n_k`` keys cut into blocks of ``block``: each block's state (m, l, acc)
    is computed alone, and states merge pairwise, in any order or tree, into the state of all
    the keys, from which o = acc / l."""
    count = -(-n_k // block)
    shown = min(count, 4)
    alt = (f"A row of {n_k} scores and values cut into {count} blocks of {block} keys. Each "
           "block gives its own state: its maximum m, its sum l of exp(s - m) and its "
           "unnormalised output acc. Two states merge into the state of both blocks by "
           "rescaling each to the larger maximum; merging all of them, in any order, gives the "
           "state of the whole row, and the output o = acc / l.")
    caption = (f"{n_k} keys in {count} blocks of {block}: each block's state (m, l, acc) is "
               "computed alone; merges combine them, in any order, into the whole row's.")
    dg = Diagram(236, alt=alt, caption=caption)
    dg.text(0, 14, "one query row: scores s and values v, by blocks", bold=True)
    width = 360 / shown
    for b in range(shown):
        x = b * width
        name = f"block {b + 1}" if b < shown - 1 or count == shown else f"... {count}"
        dg.chip(x + 4, 24, name, f"{block} keys", w=width - 8, h=36, fill="sky_blue")
        dg.arrow(x + width / 2, 62, x + width / 2, 86)
        dg.chip(x + 4, 88, "m, l, acc", w=width - 8, h=28, fill="yellow")
    for pair in range(shown // 2):
        x = pair * 2 * width
        dg.arrow(x + width / 2, 118, x + width - 4, 146)
        dg.arrow(x + 1.5 * width, 118, x + width + 4, 146)
        dg.chip(x + width / 2, 148, "merge", w=width, h=26, fill="orange")
        dg.arrow(x + width, 176, 180 + (pair - 0.5) * 40, 194)
    dg.chip(100, 196, "m, l, acc: all keys", w=160, h=26, fill="bluish_green")
    dg.text(268, 214, "o = acc / l")
    return dg
