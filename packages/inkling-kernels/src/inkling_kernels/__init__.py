"""inkling_kernels: the paged short-conv ops, their PyTorch references and the step's
metadata type.

Public API:

- :data:`SUPPORTED_DTYPES` — the activation / cache dtypes of every sconv op;
- :class:`SconvBatch` — the step's per-token metadata, built and validated once per
  step and KV-cache group, handed to every conv launch; :func:`prefill_token_count`
  counts its ``num_prefill_tokens`` hint;
- :func:`fused_sconv`, :func:`fused_sconv_add_rmsnorm` — the conv ops, on a batch;
  :func:`fused_sconv_add` — the conv + residual add without the norm (a tp > 1 shard);
  :func:`fused_sconv_kv` — the K and V convs of a layer in one launch;
- :func:`gathered_rms_norm` — the RMSNorm of rows all-gathered in per-rank pieces
  (tp > 1), reading the pieces where the all-gather put them;
- :func:`sconv_seq_metadata`, :func:`sconv_tap_map` — the per-step metadata ops;
- the references (``*_ref``, :func:`causal_conv_ref`) and the relative-logit
  attention ops (:mod:`inkling_kernels.rel_attention`).

Every op is a ``torch.ops.inkling.*`` custom op; CPU tensors run the reference, CUDA
tensors the Triton kernel (:func:`uses_triton`). One folder per op (``sconv/``,
``sconv_add_rmsnorm/``, ``sconv_kv/``, ``gathered_rmsnorm/``, ``tap_map/``, ``seq_metadata/``, ``rel_attention/``: the
public function in ``__init__.py``, ``kernel.py``, ``reference.py``); host checks in
:mod:`inkling_kernels.checks`; shared Triton helpers in ``_triton_common.py`` and their
PyTorch twins in ``_reference_common.py``.
"""

from ._dispatch import uses_triton
from .batch import PREFILL_MIN_ROWS, SconvBatch, prefill_token_count
from .checks import ACTIVATION_DTYPES as SUPPORTED_DTYPES
from .gathered_rmsnorm import gathered_rms_norm, gathered_rms_norm_ref
from .rel_attention import paged_rel_attention, rel_attention_ref, write_kv
from .sconv import causal_conv_ref, fused_sconv, fused_sconv_ref
from .sconv_add_rmsnorm import (
    fused_sconv_add,
    fused_sconv_add_ref,
    fused_sconv_add_rmsnorm,
    fused_sconv_add_rmsnorm_ref,
)
from .sconv_kv import fused_sconv_kv, fused_sconv_kv_ref
from .seq_metadata import sconv_seq_metadata, sconv_seq_metadata_ref
from .tap_map import sconv_tap_map, sconv_tap_map_ref

__version__ = "0.1.0"

__all__ = [
    "PREFILL_MIN_ROWS",
    "SUPPORTED_DTYPES",
    "SconvBatch",
    "causal_conv_ref",
    "fused_sconv",
    "fused_sconv_add",
    "fused_sconv_add_ref",
    "fused_sconv_add_rmsnorm",
    "fused_sconv_add_rmsnorm_ref",
    "fused_sconv_kv",
    "fused_sconv_kv_ref",
    "fused_sconv_ref",
    "gathered_rms_norm",
    "gathered_rms_norm_ref",
    "paged_rel_attention",
    "prefill_token_count",
    "rel_attention_ref",
    "sconv_seq_metadata",
    "sconv_seq_metadata_ref",
    "sconv_tap_map",
    "sconv_tap_map_ref",
    "uses_triton",
    "write_kv",
]
