"""The Introduction's picture: what standard attention and FlashAttention keep where (the
FlashAttention paper's Figure 1 idea, drawn here).
"""

from __future__ import annotations

from flashlib.book.svg import Diagram, size_text

__all__ = ["memory_diagram"]


def memory_diagram(n: int, d: int, B: int, itemsize: int) -> Diagram:
    """What lives where, for n rows of head dimension d, blocks B_r = B_c = B and ``itemsize``
    bytes per element: standard attention (Algorithm 0) writes the n x n matrices S and P to
    HBM; FlashAttention keeps one step's blocks (Q_i, K_j, V_j, the tile S_ij, O_i, m_i, l_i)
    in SRAM and writes only O and L to HBM."""
    matrix, tile, block = n * n * itemsize, B * B * itemsize, B * d * itemsize
    alt = (f"Two panels. Standard attention: HBM holds Q, K, V, O and the n by n matrices S "
           f"and P ({size_text(matrix)} each at n = {n}), which go back and forth to the chip. "
           f"FlashAttention: HBM holds only Q, K, V, O and L; SRAM holds the blocks Q_i, K_j, "
           f"V_j, O_i ({size_text(block)} each at B = {B}) and one {B} by {B} tile S_ij "
           f"({size_text(tile)}), which never leaves the chip.")
    caption = (f"What lives where, at n = {n}, d = {d}, blocks of {B} rows and {itemsize} bytes "
               "per number: FlashAttention never writes an n × n matrix to HBM.")
    dg = Diagram(358, alt=alt, caption=caption)
    for top, title, flash in ((0, "Standard attention (Algorithm 0)", False),
                              (180, "FlashAttention", True)):
        dg.text(0, top + 14, title, bold=True, size=13)
        dg.box(0, top + 22, 190, 130, "HBM (large, slow)", fill="blue")
        dg.box(240, top + 22, 120, 130, "SRAM (fast)", fill="orange")
        for k, name in enumerate(("Q", "K", "V", "O")):
            dg.chip(8 + 45 * k, top + 30 + 18, name, w=39)
        if not flash:
            dg.chip(8, top + 80, "S", f"n×n, {size_text(matrix)}", w=84, h=36, fill="vermillion")
            dg.chip(98, top + 80, "P", f"n×n, {size_text(matrix)}", w=84, h=36, fill="vermillion")
            dg.text(8, top + 138, "written, then read back")
            for k, line in enumerate(("one block at a", "time passes", "through; nothing",
                                      "stays")):
                dg.text(248, top + 62 + 16 * k, line)
            summary = "read Q, K, S, P, V; write S, P, O"
        else:
            dg.chip(8, top + 80, "L", w=39)
            dg.text(56, top + 97, "no S, no P")
            for k, name in enumerate(("Q_i", "K_j", "V_j")):
                dg.chip(245 + 38 * k, top + 48, name, w=34)
            # the tile's name and its size on lines of their own: S_ij's subscript would
            # otherwise run into the size below it
            dg.chip(245, top + 76, "", w=110, h=40, fill="orange")
            dg.text(300, top + 91, "S_ij", anchor="middle", bold=True)
            dg.text(300, top + 110, f"{B}×{B}, {size_text(tile)}", anchor="middle")
            for x, name in ((245, "O_i"), (283, "m_i"), (321, "l_i")):
                dg.chip(x, top + 120, name, w=34)
            summary = "read Q_i, K_j, V_j; write O_i and L_i once"
        dg.arrow(192, top + 104, 238, top + 104, "read", label_y=top + 98)
        dg.arrow(238, top + 134, 192, top + 134, "write", label_y=top + 128)
        dg.text(0, top + 170, summary, italic=True)
    return dg
