"""The GPU chapter's declared mistakes (flashlib.book.exercises.gpu): each the right code with
one change, as text (a Triton kernel must be read from a file): flashlib's own helper of the
library kernel (10.1-10.3, 10.9) or the book's solution (10.4-10.8), with each ``(old, new)``
swapped (registry.Mistake's ``source`` and ``swaps``).  Nothing here imports triton."""

from __future__ import annotations

from flashlib.book.exercises.gpu import (
    check_attention_kernel,
    check_delta_kernel,
    check_dkdv_kernel,
    check_dq_kernel,
    check_key_end,
    check_online_softmax_step,
    check_softmax_kernel,
    check_stage_bounds,
    check_visible_keys,
)
from flashlib.book.exercises.registry import Mistake, declare_mistakes

STEP = "flashlib.gpu.kernels.online_softmax_step"
END = "flashlib.gpu.kernels.key_end"
VISIBLE = "flashlib.gpu.kernels.visible_keys"


def _swapped(source: str, name: str, swaps: list, hints: list, **more) -> Mistake:
    return Mistake(name, (), tuple(hints), source=source, swaps=tuple(swaps), **more)


# ---- 10.1 the inner loop ---------------------------------------------------------------------

declare_mistakes(check_online_softmax_step, *(_swapped(STEP, *m) for m in [
    ("exp", [("tl.exp2(S_ij", "tl.exp(S_ij"), ("tl.exp2(m_i", "tl.exp(m_i")],
     ["use tl.exp2, not tl.exp"]),
    ("exp in P", [("tl.exp2(S_ij", "tl.exp(S_ij")], ["P_ij uses tl.exp"]),
    ("exp in alpha", [("tl.exp2(m_i", "tl.exp(m_i")], ["alpha uses tl.exp"]),
    ("the old m", [("return m_new, l_i, acc", "return m_i, l_i, acc")],
     ["m_i wrong: you returned the old m_i: return m_new"]),
    ("acc not rescaled", [("alpha[:, None] * acc +", "acc +")], ["acc was not rescaled"]),
    ("l not rescaled", [("alpha * l_i +", "l_i +")], ["l_i was not rescaled"]),
    ("alpha inverted", [("tl.exp2(m_i - m_new)", "tl.exp2(m_new - m_i)")],
     ["alpha is tl.exp2(m_i - m_new)"]),
    ("P with the old maximum", [("S_ij - m_new[:, None]", "S_ij - m_i[:, None]")],
     ["P_ij must subtract the new maximum"]),
    ("sum over axis 0", [("tl.sum(P_ij, 1)", "tl.sum(P_ij, 0)")],
     ["a row's sum is tl.sum(P_ij, 1)"]),
    ("max over axis 0", [("tl.max(S_ij, 1)", "tl.max(S_ij, 0)")],
     ["a row's maximum is tl.max(S_ij, 1)"]),
    ("the tile's maximum only", [("tl.maximum(m_i, tl.max(S_ij, 1))", "tl.max(S_ij, 1)")],
     ["m_new forgot the earlier tiles"]),
    ("acc normalised", [("    return m_new, l_i, acc",
                         "    acc = acc / l_i[:, None]\n    return m_new, l_i, acc")],
     ["keep acc unnormalised"]),
    ("no cast", [("P_ij.to(V_j.dtype)", "P_ij")],
     ["float16", "Both operands must be same dtype", "P_ij.to(V_j.dtype)"]),
]))


# ---- 10.2 causal tile skipping ---------------------------------------------------------------

declare_mistakes(
    check_key_end,
    Mistake("every tile", (), ("returned 70, expected 16: correct, but the tiles after the "
                               "block's last row", "the same mistake"),
            source="flashlib.gpu.exercise_kernels.key_end_all_tiles"),
    *(_swapped(END, *m) for m in [
        ("off by one", [("tl.minimum(N_K, i + B_r)", "tl.minimum(N_K, i + B_r - 1)")],
         ["returned 15, expected 16: one key short", "range(0, end, B_c) stops before end"]),
        ("too early", [("tl.minimum(N_K, i + B_r)", "tl.minimum(N_K, i)")],
         ["stop at i + B_r (not before)", "the output holds NaN"]),
        ("past N_K", [("tl.minimum(N_K, i + B_r)", "i + B_r")],
         ["returned 80, expected 70: never past N_K"]),
        ("CAUSAL ignored", [("    end = N_K\n", "    end = tl.minimum(N_K, i + B_r)\n")],
         ["without a mask every row sees every key, return N_K"]),
    ]),
)


# ---- 10.3 the boundary mask ------------------------------------------------------------------

# only a mask wrong at n_k says "right when n_k is a multiple of B_c"
_NOT_AT_N_K = ("right when n_k is a multiple of B_c",)

declare_mistakes(
    check_visible_keys,
    Mistake("the padding seen", (), ("count as keys with score 0: require cols < N_K",
                                     "right when n_k is a multiple of B_c, wrong otherwise",
                                     # hidden where the causal mask covers the padding
                                     "ok in the kernel, n_q=45, n_k=45, d=16, causal"),
            source="flashlib.gpu.exercise_kernels.visible_keys_with_bug"),
    _swapped(VISIBLE, "cols <= N_K", [("cols[None, :] < N_K", "cols[None, :] <= N_K")],
             ["key N_K = 45 is counted: cols <= N_K lets in one key past the end"]),
    # a mask of the keys alone broadcasts in the kernel, but it is no (B_r, B_c) tile
    _swapped(VISIBLE, "a mask of the keys alone",
             [("visible = cols[None, :] < N_K", "visible = cols < N_K")],
             ["the mask has shape (16,), expected (16, 16)", "it depends on the keys only"]),
    *(_swapped(VISIBLE, *m, absent=_NOT_AT_N_K) for m in [
        ("j < i", [("cols[None, :] <= rows[:, None]", "cols[None, :] < rows[:, None]")],
         ["j <= i, not j < i", "the output holds NaN"]),
        ("reversed", [("cols[None, :] <= rows[:, None]", "cols[None, :] >= rows[:, None]")],
         ["the causal mask is reversed"]),
        ("no causal mask",
         [("    if CAUSAL:\n        visible = visible & (cols[None, :] <= rows[:, None])\n", "")],
         ["the causal mask is missing"]),
        ("always causal", [("    if CAUSAL:\n        visible = visible & (",
                            "    visible = visible & (")],
         ["without CAUSAL every row sees every key"]),
    ]),
)


# ---- 10.4 a softmax kernel -------------------------------------------------------------------

def _softmax(name, swaps, hints, **more):
    return _swapped("solution", name, swaps, hints, names=("softmax_kernel",), **more)


declare_mistakes(check_softmax_kernel, *(_softmax(*m) for m in [
    ("padding as 0", [('other=float("-inf")', "other=0.0")],
     ["the 6 padding entries of a row counted", "other=-float('inf')"]),
    ("padding by default", [(', other=float("-inf")', "")], ["padding entries of a row counted"]),
    ("not normalised", [("e / tl.sum(e, 0)", "e")],
     ["not 1: divide the exponentials by their sum"]),
    ("no maximum", [("tl.exp(x - tl.max(x, 0))", "tl.exp(x)")],
     ["values up to about 3000", "subtract the row's maximum"]),
    ("not a kernel", [("@triton.jit\n", "")], ["not a Triton kernel: put @triton.jit"]),
]), *(_softmax(*m, needs="interpreter") for m in [
    ("no load mask", [(', mask=ok, other=float("-inf")', "")],
     ["read X[0, 10], past the end of its row of 10: mask the load (mask=cols < n_cols)"]),
    ("no store mask", [(", mask=ok)", ")")],
     ["wrote Y[0, 10], past the end of its row of 10: mask the store"]),
    ("rows n_cols apart", [("X + r * stride_x", "X + r * n_cols")],
     ["program_id 1 read X[0, 10]: the rows of X are stride_x elements apart",
      "X + r * stride_x"]),
    ("program_id(1)", [("tl.program_id(0)", "tl.program_id(1)")],
     ["program_id 1 read row 0 of X, not row 1: r = tl.program_id(0)"]),
]))


# ---- 10.5 a FlashAttention kernel from its signature -----------------------------------------

def _kernel(name, swaps, hints, **more):
    return _swapped("solution", name, swaps, hints, names=("attention_kernel", "grid"), **more)


declare_mistakes(check_attention_kernel, *(_kernel(*m) for m in [
    ("grid by floor", [("triton.cdiv(N_Q, B_r)", "N_Q // B_r")],
     ["= (2,): N_Q // B_r = 2 programs cover rows 0..31 only", "triton.cdiv(N_Q, B_r) = 3",
      "cover no row"]),
    ("a program per row", [("triton.cdiv(N_Q, B_r)", "N_Q")],
     ["one program per row, but each program takes a block"]),
    ("keys past N_K", [('S_ij = tl.where(cols[None, :] < N_K, S_ij * qk_scale,\n'
                        '                        float("-inf"))', "S_ij = S_ij * qk_scale")],
     ["the keys past N_K (the rest of the last tile, loaded as zeros) counted"]),
    ("exp", [("tl.exp2(S_ij", "tl.exp(S_ij"), ("tl.exp2(m_i", "tl.exp(m_i")],
     ["the scores are in base 2, use tl.exp2"]),
    ("acc not rescaled", [("alpha[:, None] * acc +", "acc +")], ["acc was not rescaled"]),
    ("l not rescaled", [("alpha * l_i +", "l_i +")], ["l_i was not rescaled"]),
    ("not divided", [("acc / l_i[:, None], mask", "acc, mask")],
     ["divide acc by l_i once, after the loop"]),
    ("not scaled", [("S_ij * qk_scale", "S_ij")], ["multiply the scores by qk_scale"]),
    ("no transpose", [("tl.trans(K_j)", "K_j")],
     ["K_j is (B_c, D), its transpose (D, B_c)", "is a tl.trans missing"]),
]), *(_kernel(*m, needs="interpreter") for m in [
    ("no Q mask", [("mask=rows[:, None] < N_Q, other=0.0)", ")")],
     ["program_id 2 read Q[45, 0], but Q has rows 0 .. 44: mask the load (rows < N_Q)"]),
    ("no K mask", [("mask=cols[:, None] < N_K, other=0.0)  # (B_c, D)\n        V_j",
                    ")  # (B_c, D)\n        V_j")],
     ["read K[70, 0], but K has rows 0 .. 69: mask the load (cols < N_K)"]),
    ("no store mask", [("acc / l_i[:, None], mask=rows[:, None] < N_Q)",
                        "acc / l_i[:, None])")],
     ["program_id 2 wrote O[45, 0], but O has rows 0 .. 44: mask the store (rows < N_Q)"]),
    ("program offset", [("tl.program_id(0) * B_r +", "tl.program_id(0) +")],
     ["program_id 1 read rows 1..16 of Q, expected 16..31: a program's first row is "
      "program_id * B_r"]),
    ("rows D apart", [("rows[:, None] * stride_q", "rows[:, None] * D")],
     ["read Q[0, 16]: the rows of Q are stride_q elements apart, not 16",
      "Q + r * stride_q"]),
]))


# ---- 10.6 the backward's preprocessing kernel ------------------------------------------------

def _delta(name, swaps, hints, **more):
    return _swapped("solution", name, swaps, hints, names=("delta_kernel",), **more)


declare_mistakes(check_delta_kernel, *(_delta(*m) for m in [
    ("dO loaded twice", [("O_i = tl.load(O + at", "O_i = tl.load(dO + at")],
     ["rowsum(dO_i * dO_i): it loads dO twice; load O_i from O"]),
    ("O loaded twice", [("dO_i = tl.load(dO + at", "dO_i = tl.load(O + at")],
     ["rowsum(O_i * O_i): it loads O twice; load dO_i from dO"]),
    ("a column's sum", [("tl.sum(dO_i * O_i, 1)", "tl.sum(dO_i * O_i, 0)")],
     ["a row's sum is tl.sum(dO_i * O_i, 1)"]),
]), *(_delta(*m, needs="interpreter") for m in [
    ("no load mask", [("O_i = tl.load(O + at, mask=ok, other=0.0)", "O_i = tl.load(O + at)")],
     ["program_id 2 read O[45, 0], but O has rows 0 .. 44: mask the load (rows < N_Q)"]),
    ("no store mask", [(", mask=rows < N_Q)", ")")],
     ["wrote Delta[45], but Delta has entries 0 .. 44: mask the store (mask=rows < N_Q)"]),
    ("program offset", [("tl.program_id(0) * B_r +", "tl.program_id(0) +")],
     ["program_id 1 read rows 1..16 of O, expected 16..31: a program's first row is "
      "program_id * B_r"]),
]))


# ---- 10.7 and 10.8 the dK/dV and dQ kernels --------------------------------------------------

_NO_D = [("P_ij * (dP_ij - D_i[:, None])", "P_ij * dP_ij")]
_EXP = [("tl.exp2(S_ij * qk_scale", "tl.exp(S_ij * qk_scale")]


def _dkdv(name, swaps, hints, **more):
    return _swapped("solution", name, swaps, hints, names=("dkdv_kernel",), **more)


declare_mistakes(check_dkdv_kernel, *(_dkdv(*m) for m in [
    ("missing D", _NO_D, ["D_i is missing: dS_ij = P_ij * (dP_ij - D_i[:, None])"]),
    ("scale applied twice",
     [('dK_j += tl.dot(tl.trans(dS_ij), Q_i, input_precision="ieee")',
       'dK_j += tl.dot(tl.trans(dS_ij), Q_i, input_precision="ieee") * scale')],
     ["the scale is applied twice"]),
    ("no scale", [("dK_j * scale, mask", "dK_j, mask")], ["multiply by scale once"]),
    ("qk_scale for scale", [("dK_j * scale, mask", "dK_j * qk_scale, mask")],
     ["the factor is scale, not qk_scale"]),
    ("exp", _EXP, ["the scores and L are in base 2"]),
    ("overwritten", [("dK_j += ", "dK_j = "), ("dV_j += ", "dV_j = ")],
     ["dK_j and dV_j hold only the last query block's share"]),
]), *(_dkdv(*m, needs="interpreter") for m in [
    ("no K mask", [("K_j = tl.load(K + kv_at, mask=cols[:, None] < N_K, other=0.0)",
                    "K_j = tl.load(K + kv_at)")],
     ["read K[70, 0], but K has rows 0 .. 69: mask the load (cols < N_K)"]),
    ("no store mask", [("tl.store(dK + kv_at, dK_j * scale, mask=cols[:, None] < N_K)",
                        "tl.store(dK + kv_at, dK_j * scale)")],
     ["wrote dK[70, 0], but dK has rows 0 .. 69: mask the store (cols < N_K)"]),
    ("rows D apart", [("rows[:, None] * stride", "rows[:, None] * D")],
     ["the rows of Q are stride elements apart, not 16"]),
    ("program offset", [("tl.program_id(0) * B_c +", "tl.program_id(0) +")],
     ["a program's first row is program_id * B_c"]),
]))


def _dq(name, swaps, hints, **more):
    return _swapped("solution", name, swaps, hints, names=("dq_kernel",), **more)


declare_mistakes(check_dq_kernel, *(_dq(*m) for m in [
    ("missing D", _NO_D, ["D_i is missing: dS_ij = P_ij * (dP_ij - D_i[:, None])"]),
    ("scale applied twice",
     [('dQ_i += tl.dot(dS_ij, K_j, input_precision="ieee")',
       'dQ_i += tl.dot(dS_ij, K_j, input_precision="ieee") * scale')],
     ["the scale is applied twice"]),
    ("exp", _EXP, ["the scores and L are in base 2"]),
    ("dQ overwritten", [("dQ_i += ", "dQ_i = ")],
     ["dQ_i holds only the last key block's share: it was overwritten, not added to"]),
]), *(_dq(*m, needs="interpreter") for m in [
    ("no store mask", [("tl.store(dQ + q_at, dQ_i * scale, mask=rows[:, None] < N_Q)",
                        "tl.store(dQ + q_at, dQ_i * scale)")],
     ["wrote dQ[45, 0], but dQ has rows 0 .. 44: mask the store (rows < N_Q)"]),
    ("no L mask", [("L_i = tl.load(L + rows, mask=rows < N_Q, other=0.0)",
                    "L_i = tl.load(L + rows)")],
     ["read L[45], but L has entries 0 .. 44: mask the load (mask=rows < N_Q)"]),
]))


# ---- 10.9 the causal forward in two stages ---------------------------------------------------

STAGES = "flashlib.gpu.staged_kernels.stage_bounds"
declare_mistakes(check_stage_bounds, *(_swapped(STAGES, *m) for m in [
    ("the diagonal in the unmasked stage",
     [("tl.minimum(i, (N_K // B_c) * B_c)", "tl.minimum(i + B_r, (N_K // B_c) * B_c)")],
     ["the unmasked stage runs into the diagonal", "the unmasked stage stops at i",
      "against torch's SDPA"]),
    ("the diagonal skipped", [("end = tl.minimum(i + B_r, N_K)", "end = split")],
     ["the diagonal blocks (keys i .. i + B_r - 1 = 0 .. 31) are skipped"]),
    ("the cut block unmasked", [("tl.minimum(i, (N_K // B_c) * B_c)", "tl.minimum(i, N_K)")],
     ["the key block cut by N_K (keys 32 .. 44) is in the unmasked stage",
      "the output holds NaN"]),
    ("past N_K", [("end = tl.minimum(i + B_r, N_K)", "end = i + B_r")],
     ["never past N_K"]),
]))
