"""One parity suite for flashlib.gpu, run three ways: the Triton kernels in Triton's interpreter
on CPU tensors (CI, no GPU), the same kernels compiled on a CUDA GPU, and beside flash-attn and
every SDPA backend there.

The same tests run in both modes (the device is chosen by flashlib.gpu.capabilities()); tests
that need CUDA are skipped with the reason otherwise.  Accuracy follows flash-attn's rule, in
one helper (:func:`assert_error_rule`): the error against a float64 reference is at most twice
the error of plain attention in the same dtype, or a floor of a few roundings.

Interpreter shapes are small on purpose (every program of the grid runs in Python): blocks of
16 or 32 make a few tiles, ragged n leaves part of the last tile empty.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="flashlib.gpu needs torch")
if importlib.util.find_spec("triton") is None:  # not importorskip: flashlib.gpu imports it
    pytest.skip("flashlib.gpu needs triton (Linux wheels only)", allow_module_level=True)

# flashlib.gpu before triton is first imported: it sets TRITON_INTERPRET=1 without a CUDA GPU
import flashlib.gpu  # noqa: E402
from flashlib.core.accuracy import assert_error_within  # noqa: E402
from flashlib.core.constants import LOG2E  # noqa: E402
from flashlib.gpu import GPUUnavailable, traps  # noqa: E402
from flashlib.gpu import triton_attention as ta  # noqa: E402
from flashlib.gpu.device import INTERPRETER_BF16_REASON  # noqa: E402
from flashlib.gpu.implementations import attention, naive_torch_attention  # noqa: E402
from tests.helpers import (  # noqa: E402
    error_floor,
    max_err,
    plain_attention,
    plain_attention_backward,
    reference_attention,
    torch_grads,
)

CAPS = flashlib.gpu.capabilities()
DEVICE = CAPS.device
CUDA = CAPS.mode == "cuda"
pytestmark = pytest.mark.skipif(not CAPS.triton, reason=" ".join(CAPS.notes[:1]))
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA GPU (torch sees none: the Triton kernels are tested in the "
    "interpreter by the other tests)")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
NP_DTYPES = {"float16": np.float16, "float32": np.float32}


# ---- the accuracy rule: flashlib.core.accuracy's helper, used by every low-precision test ---

def assert_error_rule(got, exact, plain, dtype: str, what: str) -> None:
    """err(got) <= max(2 * err(plain), floor): flash-attn's rule, checked by
    :func:`flashlib.core.accuracy.assert_error_within`; ``exact`` in float64.  The floor is
    conftest's for float16/float32; bfloat16 (eps 2**-7) gets float16's (2**-10) times 8."""
    floor = (error_floor(NP_DTYPES[dtype], np.asarray(exact)) if dtype in NP_DTYPES
             else 8 * error_floor(np.float16, np.asarray(exact)))
    assert_error_within(np.asarray(got, np.float64), np.asarray(plain, np.float64),
                        np.asarray(exact, np.float64), floor=float(floor),
                        label=f"{what} ({dtype})")


def _plain(q, k, v, causal, scale, dtype):
    """Plain attention in the inputs' precision: numpy's emulation of a GPU's fp16/fp32
    (tests/conftest.py), or naive PyTorch on the GPU for bfloat16 (numpy has no bfloat16)."""
    if dtype == "bfloat16":
        return naive_torch_attention(q, k, v, causal=causal, scale=scale).float().cpu().numpy()
    return plain_attention(*(x.cpu().numpy() for x in (q, k, v)), causal=causal, scale=scale)


def _plain_grads(q, k, v, do, causal, scale, dtype):
    if dtype == "bfloat16":
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        naive_torch_attention(qq, kk, vv, causal=causal, scale=scale).backward(do)
        return tuple(x.grad.float().cpu().numpy() for x in (qq, kk, vv))
    return plain_attention_backward(*(x.detach().cpu().numpy() for x in (q, k, v, do)),
                                    causal=causal, scale=scale)


def _qkv(shape_q, shape_k, dtype: str, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, generator=g).to(DTYPES[dtype]).to(DEVICE)
               for s in (shape_q, shape_k, shape_k))
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def _np(x) -> np.ndarray:
    return x.detach().float().cpu().numpy().astype(np.float64)


# (n_q, n_k, d, causal, dtype, blocks): multiples of the block, ragged, n_q != n_k both ways,
# n = 1, blocks larger than n, head dims 16 to 128 including ones that are not powers of two.
FORWARD_CASES = [
    (64, 64, 64, False, "float32", (32, 32)),
    (77, 77, 64, True, "float32", (32, 32)),
    (50, 113, 48, False, "float16", (16, 32)),
    (113, 50, 32, True, "float16", (32, 16)),
    (1, 1, 16, True, "float32", None),
    (40, 40, 128, False, "float16", (64, 64)),
    (45, 45, 80, True, "float16", (16, 16)),
    (33, 70, 96, True, "float32", (32, 16)),
]
GRAD_CASES = [
    (48, 48, 32, False, "float32", (16, 16)),
    (48, 48, 32, True, "float32", (16, 16)),
    (37, 37, 64, True, "float16", (16, 32)),
    (29, 45, 16, False, "float16", (32, 16)),
    (45, 29, 48, True, "float32", (16, 32)),
]


def _case_id(case) -> str:
    n_q, n_k, d, causal, dtype, blocks = case
    return (f"{n_q}x{n_k}-d{d}-{'causal' if causal else 'full'}-{dtype}"
            f"-{'x'.join(map(str, blocks)) if blocks else 'default'}")


@pytest.mark.parametrize("case", FORWARD_CASES, ids=_case_id)
def test_forward_and_lse_match_float64(case):
    n_q, n_k, d, causal, dtype, blocks = case
    q, k, v = _qkv((1, 2, n_q, d), (1, 2, n_k, d), dtype)
    scale = 1 / math.sqrt(d)
    o, lse = ta.triton_attention(q, k, v, causal=causal, blocks=blocks, return_lse=True)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    assert lse.shape == (1, 2, n_q) and lse.dtype == torch.float32
    exact, exact_lse = reference_attention(_np(q), _np(k), _np(v), causal=causal, scale=scale)
    assert_error_rule(_np(o), exact, _plain(q, k, v, causal, scale, dtype), dtype, "o")
    # the logsumexp is stored in natural-log units, not the kernel's base 2
    assert max_err(_np(lse), exact_lse) <= 1e-5 * max(1.0, float(np.abs(exact_lse).max()))


@pytest.mark.parametrize("case", GRAD_CASES, ids=_case_id)
def test_gradients_match_float64(case):
    """loss.backward() through the Triton backward, causal and not (the Triton tutorial's test
    covers causal only: triton #4541, #4174)."""
    n_q, n_k, d, causal, dtype, blocks = case
    q, k, v = _qkv((1, 2, n_q, d), (1, 2, n_k, d), dtype, grad=True)
    scale = 1 / math.sqrt(d)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype).to(DEVICE)
    o = ta.triton_attention(q, k, v, causal=causal, blocks=blocks)
    (o * do).sum().backward()
    exact = torch_grads(_np(q), _np(k), _np(v), _np(do), causal=causal, scale=scale)
    plain = _plain_grads(q, k, v, do, causal, scale, dtype)
    grads = (q.grad, k.grad, v.grad)
    for name, got, want, base in zip("qkv", grads, exact[1:], plain, strict=True):
        assert got.dtype == q.dtype
        assert_error_rule(_np(got), want, base, dtype, f"d{name}")


def test_forward_agrees_with_sdpa_and_naive_torch():
    """The same attention through the implementations layer (layout conversion included)."""
    dtype = "float32"
    q, k, v = _qkv((2, 3, 70, 32), (2, 3, 70, 32), dtype)
    for causal in (False, True):
        ours = attention(q, k, v, "triton", causal=causal)
        for impl in ("sdpa_math", "naive_torch"):
            theirs = attention(q, k, v, impl, causal=causal)
            assert max_err(_np(ours), _np(theirs)) < 2e-6, (impl, causal)


def test_flash_attn_layout_inputs_are_handled_as_views():
    """(batch, seqlen, heads, dim) tensors, transposed to (batch, heads, seqlen, dim): strided
    views go through the kernels without a copy of the caller's tensors changing anything."""
    g = torch.Generator().manual_seed(3)
    bnhd = [torch.randn(2, 50, 3, 32, generator=g).to(DEVICE) for _ in range(3)]
    q, k, v = (x.transpose(1, 2) for x in bnhd)  # (2, 3, 50, 32), not contiguous
    assert not q.is_contiguous()
    o = ta.triton_attention(q, k, v, causal=True, blocks=(16, 16))
    exact, _ = reference_attention(_np(q), _np(k), _np(v), causal=True)
    assert max_err(_np(o), exact) < 2e-6


def test_boundary_masks_never_read_past_n_or_d():
    """K, V, Q as views into buffers whose rows past n and columns past d are NaN: a missing
    boundary mask would read a NaN into the result."""
    n_q, n_k, d = 37, 45, 40
    g = torch.Generator().manual_seed(4)

    def guarded(n):
        buf = torch.full((1, 2, n + 16, d + 24), float("nan"))
        buf[:, :, :n, :d] = torch.randn(1, 2, n, d, generator=g)
        return buf.to(DEVICE)[:, :, :n, :d]

    q, k, v = guarded(n_q), guarded(n_k), guarded(n_k)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    for causal in (False, True):
        o = ta.triton_attention(q, k, v, causal=causal, blocks=(32, 32))
        exact, _ = reference_attention(_np(q), _np(k), _np(v), causal=causal)
        assert torch.isfinite(o).all() and max_err(_np(o), exact) < 2e-6
        o.sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
        q.grad = k.grad = v.grad = None


def test_hidden_huge_scores_change_nothing():
    """A key that row 0 may not see gets a score of ~300 (in base 2) with it: the forward and
    the backward mask it before exp2, so nothing overflows (numpy would warn in the
    interpreter) and the gradients stay exact."""
    q, k, v = (x.detach() for x in _qkv((1, 1, 40, 32), (1, 1, 40, 32), "float32"))
    k[..., 5, :] = 40 * q[..., 0, :]  # in the diagonal tile, which is visited
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = ta.triton_attention(q, k, v, causal=True, blocks=(16, 16))
    o.backward(torch.ones_like(o))
    exact = torch_grads(_np(q), _np(k), _np(v), np.ones((1, 1, 40, 32)), causal=True)
    for got, want in zip((o, q.grad, k.grad, v.grad), exact, strict=True):
        assert max_err(_np(got), want) < 2e-5 * max(1.0, float(np.abs(want).max()))


def test_causal_tile_skipping_is_what_the_grid_says():
    """Causal and full attention agree on the rows where the mask hides nothing (the last row
    sees every key), and the kernel is exact with any tile shape, B_r != B_c included."""
    q, k, v = _qkv((1, 1, 70, 32), (1, 1, 70, 32), "float32")
    exact, _ = reference_attention(_np(q), _np(k), _np(v), causal=True)
    for blocks in ((16, 16), (16, 64), (64, 16), (32, 16)):
        o = ta.triton_attention(q, k, v, causal=True, blocks=blocks)
        assert max_err(_np(o), exact) < 2e-6, blocks
    full = ta.triton_attention(q, k, v, blocks=(16, 16))
    assert max_err(_np(full)[..., -1, :], exact[..., -1, :]) < 2e-6


@pytest.mark.skipif(CUDA, reason="counts tl.dot calls in the interpreter")
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_visit_the_tiles_the_grid_counts(monkeypatch, causal):
    """Causal tile skipping, observed: every tl.dot the interpreter runs is counted; the forward
    does 2 per visited tile (S = Q K^T, P V), the dK/dV kernel 4 and the dQ kernel 3, on exactly
    the tiles flashlib.gpu.grid counts."""
    from triton.runtime import interpreter

    from flashlib.gpu.grid import tile_counts

    dots = []
    real = interpreter.interpreter_builder.create_dot
    monkeypatch.setattr(interpreter.interpreter_builder, "create_dot",
                        lambda *a, **kw: dots.append(1) or real(*a, **kw))
    n, blocks = 70, (16, 32)
    q, k, v = _qkv((1, 1, n, 32), (1, 1, n, 32), "float32", grad=True)
    o = ta.triton_attention(q, k, v, causal=causal, blocks=blocks)
    tiles = tile_counts(n, n, *blocks, causal)["visited"]
    assert len(dots) == 2 * tiles
    dots.clear()
    o.sum().backward()
    assert len(dots) == (4 + 3) * tiles
    if causal:
        assert tiles < tile_counts(n, n, *blocks)["visited"]


def test_leading_dims_and_three_dim_inputs():
    q, k, v = _qkv((3, 20, 16), (3, 30, 16), "float32")
    o = ta.triton_attention(q, k, v)
    exact, _ = reference_attention(_np(q), _np(k), _np(v))
    assert o.shape == (3, 20, 16) and max_err(_np(o), exact) < 2e-6


# ---- the traps -------------------------------------------------------------------------------

@pytest.mark.skipif(CUDA, reason="the interpreter's bfloat16 trap: CPU only")
def test_interpreter_bf16_dot_multiplies_bit_patterns():
    """triton #11584, measured: the interpreter's bfloat16 tl.dot is the product of the raw
    16-bit patterns (equal to float32 rounding), errors ~1e10 on O(10) results."""
    result = traps.interpreter_bf16_dot()
    assert result["max_error"] > 1e8 * result["max_exact"]
    assert result["bits_error"] < 1e-6


@pytest.mark.skipif(CUDA, reason="the interpreter refuses bfloat16; a GPU runs it (below)")
def test_interpreter_refuses_bfloat16_with_the_reason():
    q, k, v = (x.bfloat16() for x in _qkv((1, 1, 16, 16), (1, 1, 16, 16), "float32"))
    with pytest.raises(TypeError, match="q: bfloat16 is refused in Triton's interpreter") as e:
        ta.triton_attention(q, k, v)
    assert "triton-lang/triton#11584" in str(e.value) and str(e.value) == (
        f"q: {INTERPRETER_BF16_REASON}")


def test_tf32_rounding_and_what_ieee_buys():
    x = np.array([1.0, 1 + 2**-11, 1 + 2**-10 + 2**-11, -2.5, np.inf], np.float32)
    assert traps.round_to_tf32(x).tolist() == [1.0, 1.0, 1 + 2**-9, -2.5, np.inf]
    err = traps.tf32_matmul_error()
    assert err["ieee"] < 1e-6 < 1e-4 < err["tf32"] < 1e-3


@pytest.mark.skipif(CUDA, reason="interpreter behaviour")
def test_interpreter_ignores_input_precision():
    """The interpreter multiplies float32 exactly whatever input_precision says: the TF32
    error is visible only on a GPU (or in the numpy emulation above)."""
    q, k, v = _qkv((1, 1, 32, 32), (1, 1, 32, 32), "float32")
    ieee = ta.triton_attention(q, k, v, precision="ieee")
    tf32 = ta.triton_attention(q, k, v, precision="tf32")
    assert torch.equal(ieee, tf32)


def test_backward_needs_the_natural_logsumexp():
    """The kernels keep scores in base 2 (exp2); L is stored in natural-log units and the
    backward converts it back.  Feeding the backward the base-2 value breaks the gradients."""
    q, k, v = _qkv((1, 1, 40, 32), (1, 1, 40, 32), "float32")
    rows = [x.reshape(-1, 40, 32) for x in (q, k, v)]
    scale = 1 / math.sqrt(32)
    o, L = ta.forward(*rows, causal=False, scale=scale, blocks=(16, 16))
    _, exact_lse = reference_attention(_np(q), _np(k), _np(v), scale=scale)
    assert max_err(_np(L), exact_lse.reshape(1, 40)) < 1e-5
    assert max_err(_np(traps.lse_from_base2(traps.lse_to_base2(L))), _np(L)) < 1e-6
    do = torch.ones_like(o)
    good = ta.backward(*rows, o, L, do, causal=False, scale=scale, blocks=(16, 16))
    bad = ta.backward(*rows, o, L * LOG2E, do, causal=False, scale=scale, blocks=(16, 16))
    exact = torch_grads(_np(q), _np(k), _np(v), np.ones((1, 1, 40, 32)), scale=scale)
    assert max_err(_np(good[0]).reshape(1, 1, 40, 32), exact[1]) < 1e-5
    assert max_err(_np(bad[0]).reshape(1, 1, 40, 32), exact[1]) > 1e-2


# ---- bad inputs: a TypeError/ValueError naming the argument -----------------------------------

@pytest.mark.parametrize(("change", "error", "phrase"), [
    (lambda q, k, v: (q.numpy() if not CUDA else q.cpu().numpy(), k, v), TypeError,
     "q must be a torch.Tensor"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "q must be float16"),
    (lambda q, k, v: (q, k.half(), v), TypeError, "share a dtype"),
    (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), ValueError, "between 16 and 128"),
    (lambda q, k, v: (q, k, v[..., :16]), ValueError, "q's head dim"),
    (lambda q, k, v: (q, k[:, :1], v[:, :1]), ValueError, "leading"),
    (lambda q, k, v: (q[..., :0, :], k, v), ValueError, "at least one row"),
    (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, "(..., n, d)"),
])
def test_bad_inputs_name_the_argument(change, error, phrase):
    q, k, v = _qkv((1, 2, 8, 32), (1, 2, 8, 32), "float32")
    with pytest.raises(error, match=None) as e:
        ta.triton_attention(*change(q, k, v))
    assert phrase in str(e.value)


@pytest.mark.parametrize(("kwargs", "error", "phrase"), [
    ({"causal": "yes"}, TypeError, "causal must be True or False"),
    ({"scale": float("nan")}, ValueError, "scale must be finite"),
    ({"scale": "0.1"}, TypeError, "scale must be a real number"),
    ({"blocks": (24, 32)}, ValueError, "powers of two >= 16"),
    ({"blocks": 32}, ValueError, "blocks must be (B_r, B_c)"),
    ({"precision": "fp16"}, ValueError, "precision must be one of"),
])
def test_bad_options_name_the_argument(kwargs, error, phrase):
    q, k, v = _qkv((1, 1, 8, 16), (1, 1, 8, 16), "float32")
    with pytest.raises(error) as e:
        ta.triton_attention(q, k, v, **kwargs)
    assert phrase in str(e.value)


@pytest.mark.skipif(CUDA, reason="interpreter: CUDA tensors are refused")
def test_interpreter_refuses_tensors_on_another_device():
    q, k, v = _qkv((1, 1, 8, 16), (1, 1, 8, 16), "float32")
    with pytest.raises(ValueError, match="in the interpreter: use CPU tensors"):
        ta.triton_attention(q.to("meta"), k.to("meta"), v.to("meta"))


# ---- CUDA only: compiled kernels at larger sizes, bfloat16, TF32, beside flash-attn and SDPA --

@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "d"), [(1000, 64), (2048, 128), (333, 80)])
def test_cuda_forward_and_gradients(n, d, causal, dtype):
    if CAPS.dtype_refusal(dtype):
        pytest.skip(CAPS.dtype_refusal(dtype))
    q, k, v = _qkv((2, 4, n, d), (2, 4, n, d), dtype, grad=True)
    scale = 1 / math.sqrt(d)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype).cuda()
    o = ta.triton_attention(q, k, v, causal=causal)
    o.backward(do)
    exact, _ = reference_attention(_np(q), _np(k), _np(v), causal=causal, scale=scale)
    assert_error_rule(_np(o), exact, _plain(q, k, v, causal, scale, dtype), dtype, "o")
    exact_grads = torch_grads(_np(q), _np(k), _np(v), _np(do), causal=causal, scale=scale)
    plain = _plain_grads(q, k, v, do, causal, scale, dtype)
    for name, got, want, base in zip("qkv", (q.grad, k.grad, v.grad), exact_grads[1:], plain,
                                 strict=True):
        assert_error_rule(_np(got), want, base, dtype, f"d{name}")


@needs_cuda
@pytest.mark.parametrize("impl", ["flash_attn", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
                                  "sdpa_math", "naive_torch"])
def test_cuda_other_implementations_obey_the_same_rule(impl):
    """flash-attn and every SDPA backend, on the same inputs: the same 2x rule (a backend that
    cannot run here is skipped with PyTorch's reason)."""
    dtype = "float16"
    q, k, v = _qkv((2, 4, 512, 64), (2, 4, 512, 64), dtype)
    for causal in (False, True):
        try:
            o = attention(q, k, v, impl, causal=causal)
        except GPUUnavailable as err:
            pytest.skip(str(err))
        exact, _ = reference_attention(_np(q), _np(k), _np(v), causal=causal)
        plain = _plain(q, k, v, causal, 1 / math.sqrt(64), dtype)
        assert_error_rule(_np(o), exact, plain, dtype, impl)


@needs_cuda
def test_cuda_tf32_is_less_accurate_than_ieee():
    if CAPS.compute_capability < (8, 0):
        pytest.skip("TF32 tensor cores start with Ampere (8.0)")
    q, k, v = _qkv((1, 4, 1024, 64), (1, 4, 1024, 64), "float32")
    exact, _ = reference_attention(_np(q), _np(k), _np(v))
    ieee = max_err(_np(ta.triton_attention(q, k, v, precision="ieee")), exact)
    tf32 = max_err(_np(ta.triton_attention(q, k, v, precision="tf32")), exact)
    assert ieee < 1e-5 and tf32 > 3 * ieee


@needs_cuda
def test_cuda_bf16_dot_is_right_when_compiled():
    if CAPS.dtype_refusal("bfloat16"):
        pytest.skip(CAPS.dtype_refusal("bfloat16"))
    result = traps.interpreter_bf16_dot()
    assert result["max_error"] < 1e-2 * max(1.0, result["max_exact"])
