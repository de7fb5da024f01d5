"""gathered_rms_norm: the RMSNorm of rows all-gathered in per-rank pieces [tp, T, S].

The Triton kernel (TRITON_INTERPRET=1 on CPU; compiled where there is a GPU) and the
public op's CPU reference, on random pieces, against an independent float64 RMSNorm of
the rows put together with torch.cat, rounded as transformers' InklingRMSNorm; the
kernel against the reference within one rounding step (the fp32 sums of squares may
add up in another order); argument checks before any launch."""

from __future__ import annotations

import pytest
import torch

from inkling_kernels import gathered_rms_norm, gathered_rms_norm_ref
from inkling_kernels.gathered_rmsnorm.kernel import (
    TILE_ELEMENTS,
    GatheredNormConfig,
    choose_gathered_norm_config,
    gathered_rms_norm_triton,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = 1e-5
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Two roundings (after the normalisation, after the weight) of values whose fp32 rstd
# may differ from the reference's in the last bits (another summation order): up to
# two steps; Triton's interpreter also truncates fp32 to bf16 instead of rounding.
KERNEL_STEPS = 2.01
# float32 has no rounding to a narrower dtype: fp32 sums and rsqrt against float64.
FP32_STEPS = 16.01


def _tol(dtype: torch.dtype, kernel: bool) -> float:
    return FP32_STEPS if dtype == torch.float32 else (KERNEL_STEPS if kernel else 1.01)


def _pieces(tp: int, t: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shards = (3 * torch.randn(tp, t, width) + 0.5).to(dtype)
    weight = (1 + 0.3 * torch.randn(tp * width)).to(dtype)
    return shards, weight


def _independent(shards: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float64 RMSNorm of the rows joined by cat, rounded where transformers rounds."""
    rows = torch.cat(list(shards.unbind(0)), dim=1).double()
    y = (rows / torch.sqrt((rows * rows).mean(dim=1, keepdim=True) + eps)).to(shards.dtype)
    return (weight.double() * y.double()).to(shards.dtype)


def _steps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference in units of one rounding step at the value's magnitude."""
    unit = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(1e-3)
    return float(((got.float() - want.float()).abs() / unit).max()) if want.numel() else 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tp,t,width", [(1, 5, 64), (2, 1, 48), (2, 37, 96), (4, 3, 24), (8, 9, 16), (2, 0, 32)])
def test_reference_and_kernel(dtype: torch.dtype, tp: int, t: int, width: int) -> None:
    shards, weight = _pieces(tp, t, width, dtype)
    want = _independent(shards, weight, EPS)
    ref = gathered_rms_norm_ref(shards, weight, EPS)
    assert ref.shape == (t, tp * width) and ref.dtype == dtype
    assert _steps(ref, want) <= _tol(dtype, False)
    got = gathered_rms_norm_triton(shards.to(DEVICE), weight.to(DEVICE), EPS).cpu()
    assert got.shape == (t, tp * width) and got.dtype == dtype
    assert _steps(got, want) <= _tol(dtype, True)
    assert _steps(got, ref) <= _tol(dtype, True)
    # the public op (reference on CPU, the kernel on CUDA)
    assert _steps(gathered_rms_norm(shards.to(DEVICE), weight.to(DEVICE), EPS).cpu(), want) <= _tol(dtype, True)


@pytest.mark.parametrize("cfg", [GatheredNormConfig(4, 16, 1), GatheredNormConfig(2, 32, 2), GatheredNormConfig(1, 128, 4)])
def test_kernel_tiles(cfg: GatheredNormConfig) -> None:
    """Several chunks a piece, masked chunk tails (width 40) and masked rows (T 7)."""
    shards, weight = _pieces(3, 7, 40, torch.bfloat16)
    got = gathered_rms_norm_triton(shards.to(DEVICE), weight.to(DEVICE), EPS, config=cfg).cpu()
    assert _steps(got, _independent(shards, weight, EPS)) <= KERNEL_STEPS


@pytest.mark.parametrize("tp,width", [(8, 768), (2, 3072), (4, 1536), (1, 6144), (3, 40), (8, 100), (2, 64)])
def test_default_tiles_cover_the_row_exactly_where_they_can(tp: int, width: int) -> None:
    """The default tile: pieces side by side, channels in a power of two that divides
    the width when one of at least 64 fits the tile (no masked lanes at Inkling's TP
    shards), else a masked power-of-two tail; never more than TILE_ELEMENTS."""
    cfg = choose_gathered_norm_config(tp, width)
    pieces = 1 << (tp - 1).bit_length()
    assert cfg.block_t == 1 and pieces * cfg.block_s <= TILE_ELEMENTS
    if width % 64 == 0:
        assert width % cfg.block_s == 0 and cfg.block_s >= 64
    else:
        assert cfg.block_s >= min(width, TILE_ELEMENTS // pieces)
    shards, weight = _pieces(tp, 2, width, torch.bfloat16)
    got = gathered_rms_norm_triton(shards.to(DEVICE), weight.to(DEVICE), EPS, config=cfg).cpu()
    assert _steps(got, _independent(shards, weight, EPS)) <= KERNEL_STEPS


def test_pieces_are_read_in_rank_order() -> None:
    """Swapping two ranks' pieces changes the rows (the op is not a per-piece norm)."""
    shards, weight = _pieces(2, 4, 32, torch.float32)
    got = gathered_rms_norm(shards.to(DEVICE), weight.to(DEVICE), EPS).cpu()
    swapped = gathered_rms_norm(shards.flip(0).contiguous().to(DEVICE), weight.to(DEVICE), EPS).cpu()
    assert not torch.allclose(got, swapped)
    assert torch.allclose(got[:, :32], _independent(shards, weight, EPS)[:, :32], rtol=1e-5, atol=1e-6)


def test_op_registration() -> None:
    shards, weight = _pieces(2, 3, 16, torch.bfloat16)
    torch.library.opcheck(torch.ops.inkling.gathered_rms_norm.default, (shards, weight, EPS))


@pytest.mark.parametrize(
    "shards,weight,eps,err,match",
    [
        (torch.zeros(4, 8), torch.ones(8), EPS, ValueError, r"\[tp, T, S\]"),
        (torch.zeros(2, 4, 8, dtype=torch.int32), torch.ones(16), EPS, TypeError, "bfloat16, float16 or float32"),
        (torch.zeros(2, 8, 4).transpose(1, 2), torch.ones(16), EPS, ValueError, "contiguous"),
        (torch.zeros(2, 4, 8), torch.ones(8), EPS, ValueError, r"\[C\] = \[16\]"),
        (torch.zeros(2, 4, 8), torch.ones(16, dtype=torch.int64), EPS, TypeError, "float tensor"),
        (torch.zeros(2, 4, 8), torch.ones(32)[::2], EPS, ValueError, "contiguous"),
        (torch.zeros(2, 4, 8), torch.ones(16), -1.0, ValueError, ">= 0"),
        (torch.zeros(2, 4, 8), torch.ones(16), True, TypeError, "eps must be a float"),
        ("not a tensor", torch.ones(16), EPS, TypeError, "shards"),
    ],
)
def test_bad_arguments(shards: object, weight: object, eps: object, err: type, match: str) -> None:
    # the exported reference and the direct launcher check as the op
    for fn in (gathered_rms_norm, gathered_rms_norm_ref, gathered_rms_norm_triton):
        with pytest.raises(err, match=match):
            fn(shards, weight, eps)  # type: ignore[arg-type]


def test_launcher_refuses_a_foreign_config() -> None:
    shards, weight = _pieces(2, 3, 16, torch.float32)
    with pytest.raises(TypeError, match="GatheredNormConfig"):
        gathered_rms_norm_triton(shards.to(DEVICE), weight.to(DEVICE), EPS, config=(1, 16, 1))  # type: ignore[arg-type]


def test_traces_under_torch_compile_with_dynamic_rows() -> None:
    """The public function (host checks on fake tensors, the custom op's fake) inside a
    full graph with a dynamic row count, as vLLM compiles the served model: a module
    holding the weight and a float eps, the token dimension marked dynamic, no grad."""

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter((1 + 0.3 * torch.randn(32)).to(torch.bfloat16))
            self.eps = EPS

        def forward(self, shards: torch.Tensor) -> torch.Tensor:
            return gathered_rms_norm(shards, self.weight, self.eps)

    norm = Norm()
    fn = torch.compile(norm, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        for t in (3, 5, 9):
            shards = _pieces(2, t, 16, torch.bfloat16)[0]
            torch._dynamo.mark_dynamic(shards, 1)
            assert torch.equal(fn(shards), gathered_rms_norm(shards, norm.weight, EPS))
