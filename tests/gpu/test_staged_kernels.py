"""The Triton tutorial's schedule as kernels (flashlib.gpu.staged_kernels), run in Triton's
interpreter on CPU tensors (compiled on a CUDA GPU): the preprocessing kernel's D, the causal
forward in two stages (unmasked blocks, then the masked diagonal) against SDPA and a float64
reference, and the three-kernel backward (D, dK/dV, dQ) against torch autograd, on awkward
shapes (small: the interpreter runs every program in Python)."""

from __future__ import annotations

import importlib.util
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="flashlib.gpu needs torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("flashlib.gpu needs triton (Linux wheels only)", allow_module_level=True)

import flashlib.gpu  # noqa: E402  (before triton: TRITON_INTERPRET=1 without a CUDA GPU)
from flashlib.gpu import staged_kernels as sk  # noqa: E402

CAPS = flashlib.gpu.capabilities()
DEVICE = CAPS.device
pytestmark = pytest.mark.skipif(not CAPS.triton, reason=" ".join(CAPS.notes[:1]))

# (B*H, n_q, n_k, d): ragged last blocks, n_q != n_k both ways, one row, d not a power of two
SHAPES = [(2, 37, 37, 16), (1, 50, 21, 24), (2, 5, 40, 16), (1, 1, 1, 16), (3, 33, 64, 32)]


def _qkv(bh, n_q, n_k, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(bh, n, d, generator=g).to(dtype).to(DEVICE)
                 for n in (n_q, n_k, n_k, n_q))


def _reference(q, k, v, do):
    """o, lse and the gradients of causal (top-left) attention by autograd, float64."""
    qq, kk, vv = (x.detach().double().cpu().requires_grad_() for x in (q, k, v))
    n_q, n_k = q.shape[1], k.shape[1]
    s = qq @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), -math.inf)
    o = torch.softmax(s, -1) @ vv
    o.backward(do.double().cpu())
    return o.detach(), torch.logsumexp(s, -1).detach(), (qq.grad, kk.grad, vv.grad)


def _err(a, b) -> float:
    return float((a.double().cpu() - b.double().cpu()).abs().max())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("blocks", [(32, 16), (16, 16)])
def test_two_stage_causal_forward(shape, blocks):
    q, k, v, do = _qkv(*shape)
    o, lse = sk.causal_forward(q, k, v, 1 / math.sqrt(shape[-1]), blocks=blocks)
    ref, ref_lse, _ = _reference(q, k, v, do)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert _err(o, ref) <= 2e-6 and _err(lse, ref_lse) <= 2e-6
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert _err(o, sdpa) <= 2e-6


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_preprocessing_kernel_computes_delta(shape):
    q, _, _, do = _qkv(*shape)
    o = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = sk.delta(o, do)
    assert got.dtype == torch.float32 and got.shape == o.shape[:2]
    assert _err(got, (o.double() * do.double()).sum(-1)) <= 1e-5


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_three_kernel_backward_equals_autograd(shape, causal):
    q, k, v, do = _qkv(*shape, seed=1)
    scale = 1 / math.sqrt(shape[-1])
    if causal:
        o, lse = sk.causal_forward(q, k, v, scale)
        ref_o, _, grads = _reference(q, k, v, do)
    else:
        qq, kk, vv = (x.double().requires_grad_() for x in (q, k, v))
        ref_o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
        ref_o.backward(do.double())
        grads = (qq.grad, kk.grad, vv.grad)
        s = q.double() @ k.double().transpose(-1, -2) * scale
        o, lse = ref_o.detach().float(), torch.logsumexp(s, -1).float()
    got = sk.backward(q, k, v, o, lse, do, causal, scale)
    for g, r in zip(got, grads, strict=True):
        assert g.shape == r.shape and _err(g, r) <= 5e-6 * max(1.0, float(r.abs().max()))


def test_float16_within_twice_plain_attention():
    """flash-attn's rule: at most twice the error of plain attention in float16 (computed in
    float32, rounded once), or a floor of a float16 rounding."""
    q, k, v, do = _qkv(2, 40, 40, 16, dtype=torch.float16, seed=2)
    o, _ = sk.causal_forward(q, k, v, 1 / math.sqrt(16))
    exact, _, _ = _reference(q, k, v, do)
    plain = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True).half()
    assert o.dtype == torch.float16
    assert _err(o, exact) <= max(2 * _err(plain, exact), 2**-10)


@settings(max_examples=200, deadline=None)
@given(i_block=st.integers(0, 20), n_k=st.integers(1, 300), b=st.sampled_from([16, 32, 64]),
       ratio=st.sampled_from([1, 2, 4]))
def test_stages_split_the_visible_keys(i_block, n_k, b, ratio):
    """Stage 1 visits only key blocks every row of the query block sees whole; stage 1 and
    stage 2 together visit every key a row sees, and no block above the diagonal."""
    B_c, B_r = b, b * ratio
    i = i_block * B_r
    unmasked, masked = sk.causal_stages(i, n_k, B_r, B_c)
    for j in unmasked:
        assert j + B_c <= n_k and j + B_c - 1 <= i  # whole, and below row i's diagonal
    seen = {c for j in (*unmasked, *masked) for c in range(j, min(j + B_c, n_k))}
    visible = {c for c in range(n_k) if c <= i + B_r - 1}  # keys some row of the block sees
    assert visible <= seen
    assert all(j <= i + B_r - 1 for j in masked)  # no block wholly above the diagonal


def test_bad_blocks_are_refused():
    q, k, v, _ = _qkv(1, 4, 4, 16)
    for blocks in ((16, 32), (24, 16), (8, 8)):
        with pytest.raises(ValueError, match="blocks must be"):
            sk.causal_forward(q, k, v, 0.25, blocks=blocks)
    with pytest.raises(ValueError, match="o and do must have one shape"):
        sk.delta(q, q[:, :2])



def test_stage_bounds_probe_matches_causal_stages():
    """The kernel's stage_bounds, run alone by the GPU chapter's probe, splits the keys as
    causal_stages (the same arithmetic in Python) says."""
    from flashlib.gpu.exercise_kernels import stage_bounds_of

    for n_q, n_k, B_r, B_c in [(64, 64, 32, 16), (70, 45, 32, 16), (50, 21, 32, 16)]:
        got = stage_bounds_of(n_q, n_k, B_r, B_c)
        for p, (split, end) in enumerate(got):
            unmasked, masked = sk.causal_stages(p * B_r, n_k, B_r, B_c)
            assert (unmasked.stop, masked.stop) == (split, end)


def test_backward_reads_a_given_delta():
    """backward(..., D_rows=) uses that D instead of its preprocessing kernel's: the same
    gradients from the right D, other ones from a wrong D, and a D of the wrong shape refused."""
    q, k, v, do = _qkv(1, 20, 20, 16, seed=4)
    o, lse = sk.causal_forward(q, k, v, 0.25, blocks=(16, 16))
    right = sk.backward(q, k, v, o, lse, do, True, 0.25)
    given = sk.backward(q, k, v, o, lse, do, True, 0.25, D_rows=sk.delta(o, do))
    assert all(torch.equal(a, b) for a, b in zip(right, given, strict=True))
    wrong = sk.backward(q, k, v, o, lse, do, True, 0.25, D_rows=torch.zeros(1, 20, device=DEVICE))
    assert _err(wrong[0], right[0]) > 1e-3
    with pytest.raises(ValueError, match="D_rows must be a"):
        sk.backward(q, k, v, o, lse, do, True, 0.25, D_rows=torch.zeros(20))
