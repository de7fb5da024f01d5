"""Shared ``@triton.jit`` helpers: tap resolution and the same-step hazard rule of
every sconv kernel (``sconv``, ``tap_map``, ``sconv_add_rmsnorm``). The rules are
stated, and written in PyTorch for the references, in
:mod:`inkling_kernels._reference_common`.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

__all__ = [
    "INTERPRETER_ROWS", "decode_tap_codes", "is_interpreter", "last_writers", "match_last_writer", "match_rows",
    "pdl_launch", "pdl_supported", "pow2_ceil", "resolve_taps",
]


def is_interpreter() -> bool:
    """Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: Rows a program in the row-wise norm kernels' default tiles under the interpreter.
#: It runs a launch's programs one after another in Python, so its time grows with
#: their number: the GPU tilings (one row a program, or a row over several programs)
#: would make an engine on the interpreter spend most of its time in those kernels.
INTERPRETER_ROWS = 16


def pdl_supported(dev: torch.device) -> bool:
    """Programmatic dependent launch (``launch_pdl`` and ``griddepcontrol``) is
    available: compiled CUDA on SM 9.0 or newer."""
    return dev.type == "cuda" and not is_interpreter() and _major_capability(dev.index) >= 9


def pdl_launch(pdl: bool, dev: torch.device) -> dict[str, bool]:
    """Launch keywords of a kernel with a ``USE_PDL`` constexpr: ``USE_PDL`` and
    ``launch_pdl`` both on when ``pdl`` is asked for and supported, else off."""
    on = pdl and pdl_supported(dev)
    return {"USE_PDL": on, "launch_pdl": True} if on else {"USE_PDL": False}


@functools.lru_cache(maxsize=None)
def _major_capability(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for the host's grid arithmetic (``triton.cdiv`` called from Python
    costs microseconds: it goes through Triton's function wrapper)."""
    return -(-a // b)


def pow2_ceil(n: int) -> int:
    """The smallest power of two >= n (>= 1)."""
    return 1 << (max(n, 1) - 1).bit_length()


@triton.jit
def resolve_taps(
    pos, rows64, qs, seq, live, dist,
    table_ptr, num_reqs, max_blocks, stride_table, slot_limit,
    N: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """Where the taps of a tile come from.

    ``pos``, ``rows64``, ``qs``, ``seq``: ``[BT]`` int64 (position, row, query start,
    request row); ``live``: ``[BT, K]`` the taps to resolve; ``dist``: ``[K]`` int64
    distances (>= 1 where live). Returns ``(trow, in_fwd, pslot)``, each ``[BT, K]``:
    the tap's row in x, whether it is in this forward (read it from that row), and its
    pre-forward cache slot through the block table (``-1``: none, or unusable: outside
    the table or not in ``[0, slot_limit)``). With ``SKIP_EMPTY`` the table is read only
    when the tile has a pre-forward tap (a tile-wide reduction first); without it the
    (masked) table load issues at once.
    """
    src = pos[:, None] - dist[None, :]
    trow = rows64[:, None] - dist[None, :]
    has_tap = live & (src >= 0)
    in_fwd = has_tap & (trow >= qs[:, None]) & (trow >= 0)
    pre = has_tap & ~in_fwd
    if SKIP_EMPTY:
        pslot = tl.full(pre.shape, -1, tl.int64)
        if tl.sum(tl.sum(pre.to(tl.int32), axis=1), axis=0) > 0:
            pslot = _table_slots(pre, src, seq, table_ptr, num_reqs, max_blocks, stride_table, slot_limit, N)
    else:
        pslot = _table_slots(pre, src, seq, table_ptr, num_reqs, max_blocks, stride_table, slot_limit, N)
    return trow, in_fwd, pslot


@triton.jit
def _table_slots(pre, src, seq, table_ptr, num_reqs, max_blocks, stride_table, slot_limit, N: tl.constexpr):
    """The cache slots of the pre-forward taps ``pre`` (source positions ``src``)
    through the block table; -1 where unusable."""
    psrc = tl.where(pre, src, 0)
    bidx = psrc // N
    ok = pre & (seq >= 0)[:, None] & (seq < num_reqs)[:, None] & (bidx < max_blocks)
    entry = tl.load(table_ptr + seq[:, None] * stride_table + bidx, mask=ok, other=0).to(tl.int64)
    ps = entry * N + psrc % N
    return tl.where(ok & (ps >= 0) & (ps < slot_limit), ps, -1)


@triton.jit
def match_rows(keys, svals, srows):
    """``[K, S]``: ``srows[j]`` where ``keys[i] == svals[j]``, else -1 (keys use a
    value no slot takes, e.g. -2, for "no key"; svals -1 for "no write")."""
    return tl.where(keys[:, None] == svals[None, :], srows[None, :], -1)


@triton.jit
def match_last_writer(keys, svals, srows):
    """``[K]``: the largest ``srows[j]`` with ``svals[j] == keys[i]``, else -1 (the
    hazard rule: the last writer wins)."""
    return tl.max(match_rows(keys, svals, srows), axis=1)


@triton.jit
def last_writers(keys, slot_ptr, num_tokens, SCAN: tl.constexpr):
    """For each slot in ``keys`` (1-D int64; -2 for "no slot") the last row ``t`` of
    this launch with ``slot_mapping[t] == key``, or -1: ``slot_mapping`` scanned
    ``SCAN`` rows at a time."""
    hit = tl.full(keys.shape, -1, tl.int64)
    # A while loop: under TRITON_INTERPRET=1 a runtime scalar is a 1-element array,
    # which range() rejects with NumPy >= 2.4.
    s0 = 0
    while s0 < num_tokens:
        srows = s0 + tl.arange(0, SCAN)
        sval = tl.load(slot_ptr + srows, mask=srows < num_tokens, other=-1).to(tl.int64)
        hit = tl.maximum(hit, match_last_writer(keys, sval, srows.to(tl.int64)))
        s0 += SCAN
    return hit


@triton.jit
def decode_tap_codes(code, num_slots):
    """Tap-map codes (int64, any shape) -> ``(x row, cache slot)``, each -1 where the
    tap does not come from there (both -1: no tap). A slot at or beyond ``num_slots``
    reads as no tap, and so does its same-step writer (that write is skipped)."""
    writer = (code >> 32) - 1  # same-step writer row, -1 if none
    cslot = code - ((writer + 1) << 32)
    usable = (code >= 0) & (cslot < num_slots)
    xrow = tl.where(code <= -2, -code - 2, tl.where(usable & (writer >= 0), writer, -1))
    return xrow, tl.where(usable & (writer < 0), cslot, -1)
