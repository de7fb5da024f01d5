"""sconv_seq_metadata: the Triton kernel (interpreted on CPU) and the CPU reference
path against a plain Python loop, exactly, including pad rows and the empty batch."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_kernels import sconv_seq_metadata, sconv_seq_metadata_ref

SENTINEL = 12345
#: where the Triton kernel runs: the GPU when there is one, else the interpreter
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _run(impl: str, qsl: torch.Tensor, num_reqs: int, num_actual: int, num_padded: int, capacity: int):
    seq = torch.full((capacity,), SENTINEL, dtype=torch.int32)
    start = torch.full((capacity,), SENTINEL, dtype=torch.int32)
    if impl == "public":
        sconv_seq_metadata(qsl, num_reqs, num_actual, seq, start, num_padded)
    elif impl == "reference":
        sconv_seq_metadata_ref(qsl, num_reqs, num_actual, seq, start, num_padded)
    else:
        from inkling_kernels.seq_metadata import kernel as seq_metadata

        # "triton": the heuristic tiles; "triton-small-block": 16-row programs.
        block = 16 if impl == "triton-small-block" else None
        outs = seq.to(KERNEL_DEVICE), start.to(KERNEL_DEVICE)
        seq_metadata.sconv_seq_metadata_triton(qsl.to(KERNEL_DEVICE), num_reqs, num_actual, *outs, num_padded,
                                               block=block)
        seq, start = (t.cpu() for t in outs)
    return seq, start


def _expected(lens: list[int], num_padded: int, capacity: int) -> tuple[list[int], list[int]]:
    seq, start = [], []
    row = 0
    for r, n in enumerate(lens):
        seq += [r] * n
        start += [row] * n
        row += n
    pad = num_padded - row
    return (
        seq + [0] * pad + [SENTINEL] * (capacity - num_padded),
        start + [0] * pad + [SENTINEL] * (capacity - num_padded),
    )


IMPLS = ("public", "reference", "triton", "triton-small-block")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(5))
def test_random_batches(impl: str, seed: int) -> None:
    rng = random.Random(seed)
    num_reqs = [1, 3, 70, 200, 300][seed]
    lens = [rng.choice([0, 1, 1, 1, 4, 17]) for _ in range(num_reqs)]  # empty requests too
    num_actual = sum(lens)
    num_padded = num_actual + rng.randint(0, 9)
    capacity = num_padded + 5
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=rng.choice([torch.int32, torch.int64]))
    qsl = torch.cat([qsl, torch.full((3,), 999, dtype=qsl.dtype)])  # stale tail past num_reqs
    seq, start = _run(impl, qsl, num_reqs, num_actual, num_padded, capacity)
    exp_seq, exp_start = _expected(lens, num_padded, capacity)
    assert seq.tolist() == exp_seq
    assert start.tolist() == exp_start


@pytest.mark.parametrize("impl", IMPLS)
def test_large_prefill(impl: str) -> None:
    lens = [5000, 1, 300]
    qsl = torch.tensor([0, 5000, 5001, 5301], dtype=torch.int32)
    seq, start = _run(impl, qsl, 3, 5301, 5320, 5320)
    exp_seq, exp_start = _expected(lens, 5320, 5320)
    assert seq.tolist() == exp_seq and start.tolist() == exp_start


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_batch(impl: str) -> None:
    qsl = torch.zeros(1, dtype=torch.int32)
    seq, start = _run(impl, qsl, 0, 0, 0, 4)
    assert seq.tolist() == [SENTINEL] * 4 and start.tolist() == [SENTINEL] * 4
    # no requests, only pad rows (a padded CUDA-graph batch)
    seq, start = _run(impl, qsl, 0, 0, 3, 4)
    assert seq.tolist() == [0, 0, 0, SENTINEL] and start.tolist() == [0, 0, 0, SENTINEL]


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=40),
    pad=st.integers(min_value=0, max_value=5),
)
def test_hypothesis_reference_and_kernel(lens: list[int], pad: int) -> None:
    num_actual = sum(lens)
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    exp = _expected(lens, num_actual + pad, num_actual + pad + 1)
    for impl in ("reference", "triton", "triton-small-block"):
        seq, start = _run(impl, qsl, len(lens), num_actual, num_actual + pad, num_actual + pad + 1)
        assert (seq.tolist(), start.tolist()) == exp


def test_validation_errors() -> None:
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)
    ok = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_actual_tokens <= num_padded_tokens"):
        sconv_seq_metadata(qsl, 2, 5, ok, ok.clone(), 4)
    with pytest.raises(ValueError, match="needs"):
        sconv_seq_metadata(qsl, 3, 5, ok, ok.clone(), 5)
    with pytest.raises(TypeError, match="int32"):
        sconv_seq_metadata(qsl, 2, 5, ok.long(), ok.clone(), 5)
    with pytest.raises(ValueError, match="holds 4 rows"):
        sconv_seq_metadata(qsl, 2, 5, ok[:4], ok.clone(), 5)
    with pytest.raises(ValueError, match="num_reqs is 0"):
        sconv_seq_metadata(qsl, 0, 5, ok, ok.clone(), 5)
    with pytest.raises(TypeError, match="num_reqs must be an int"):
        sconv_seq_metadata(qsl, 2.0, 5, ok, ok.clone(), 5)  # type: ignore[arg-type]
    # outputs that share memory (with each other or with query_start_loc): refused,
    # nothing written; halves of one buffer are fine
    buf = torch.full((16,), -7, dtype=torch.int32)
    qsl_in_buf = torch.cat([qsl, torch.zeros(5, dtype=torch.int32)])
    for seq_out, start_out, match in ((buf[:8], buf[:8], "query_start_out overlaps seq_idx_out"),
                                      (buf[:8], buf[4:12], "query_start_out overlaps seq_idx_out"),
                                      (qsl_in_buf, buf[:8], "seq_idx_out overlaps query_start_loc")):
        src = qsl_in_buf[:3] if seq_out is qsl_in_buf else qsl
        with pytest.raises(ValueError, match=match):
            sconv_seq_metadata(src, 2, 5, seq_out, start_out, 5)
        assert (buf == -7).all()
    want = torch.full((16,), -7, dtype=torch.int32)
    sconv_seq_metadata_ref(qsl, 2, 5, want[:8], want[8:], 5)
    sconv_seq_metadata(qsl, 2, 5, buf[:8], buf[8:], 5)
    assert torch.equal(buf, want)



@pytest.mark.parametrize("impl", ["public", "reference", "triton"])
@pytest.mark.parametrize("qsl,num_actual,match", [
    ([1, 2, 5], 5, r"query_start_loc\[0\] must be 0, got 1"),
    ([0, 4, 2], 2, r"non-decreasing, but entry 2 \(2\) < entry 1 \(4\)"),
    ([0, 2, 5], 4, r"query_start_loc\[2\] = 5 but num_actual_tokens is 4"),
    ([0, 2, 5], 6, r"query_start_loc\[2\] = 5 but num_actual_tokens is 6"),
], ids=["start", "decreasing", "fewer-tokens", "more-tokens"])
def test_host_query_start_loc_values(impl: str, qsl: list[int], num_actual: int, match: str) -> None:
    """A CPU ``query_start_loc`` is checked against the counts it must agree with
    before anything is written (its entries past ``num_reqs`` stay free). A device
    one is never read on the host."""
    from inkling_kernels.seq_metadata.kernel import sconv_seq_metadata_triton

    fn = {"public": sconv_seq_metadata, "reference": sconv_seq_metadata_ref, "triton": sconv_seq_metadata_triton}[impl]
    seq = torch.full((9,), SENTINEL, dtype=torch.int32)
    start = seq.clone()
    with pytest.raises(ValueError, match=match):
        fn(torch.tensor(qsl + [-7], dtype=torch.int32), 2, num_actual, seq, start, 8)
    assert seq.tolist() == [SENTINEL] * 9 and start.tolist() == [SENTINEL] * 9
