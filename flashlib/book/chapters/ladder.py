"""The Optimisation ladder's picture: where the fast rungs put the work of one tile.
"""

from __future__ import annotations

from flashlib.book.svg import Diagram

__all__ = ["ladder_diagram"]


def ladder_diagram(d: int, B_r: int, B_c: int, d_v: int) -> Diagram:
    """Where the optimisation ladder puts the work of one tile: the stale maximum rides in the
    first matmul ([Q_i, -m_i] [K_j^T; 1] = S_ij - m_i), one exp2 stays outside, and the row sum
    rides in the second (P_ij [V_j | 1] = [P_ij V_j | l])."""
    alt = (f"One tile of the fast rungs. First matmul: the query block with an extra column "
           f"holding minus the running maximum ({B_r} by {d + 1}) times the key block, "
           f"transposed, with an extra row of ones ({d + 1} by {B_c}), gives the scores minus "
           f"the maximum ({B_r} by {B_c}). Then exp2, the only work outside the matmuls. Second "
           f"matmul: the probabilities times the value block with an extra column of ones "
           f"({B_c} by {d_v + 1}) gives P V and the row sums l together.")
    caption = (f"One tile at d = {d}, B_r = {B_r}, B_c = {B_c}: both matmuls carry an extra "
               "row or column, so only exp2 is left outside them.")
    dg = Diagram(214, alt=alt, caption=caption)
    dg.text(0, 14, "1. scores, maximum subtracted, in one matmul", bold=True)
    dg.chip(0, 24, "[Q_i, -m_i]", f"{B_r}×{d + 1}", w=100, h=36, fill="sky_blue")
    dg.text(108, 46, "×")
    dg.chip(122, 24, "[K_jᵀ; 1]", f"{d + 1}×{B_c}", w=100, h=36, fill="blue")
    dg.text(230, 46, "=")
    dg.chip(246, 24, "S_ij - m_i", f"{B_r}×{B_c}", w=114, h=36, fill="orange")
    dg.text(0, 88, "2. the one pass outside them", bold=True)
    dg.chip(246, 96, "exp2 in place", "gives P_ij", w=114, h=36, fill="vermillion")
    dg.arrow(303, 62, 303, 94)
    dg.text(0, 150, "3. P V and the row sums l in one matmul", bold=True)
    dg.chip(0, 160, "P_ij", f"{B_r}×{B_c}", w=80, h=36, fill="orange")
    dg.text(88, 182, "×")
    dg.chip(102, 160, "[V_j | 1]", f"{B_c}×{d_v + 1}", w=100, h=36, fill="bluish_green")
    dg.text(210, 182, "=")
    dg.chip(226, 160, "[P_ij V_j | l]", f"{B_r}×{d_v + 1}", w=134, h=36, fill="yellow")
    return dg
