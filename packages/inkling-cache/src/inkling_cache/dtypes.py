"""Cache element types, named by string so this package never needs torch.

Accepted names: ``"bfloat16"``, ``"float16"``, ``"float32"`` and the short forms
``"bf16"``, ``"fp16"``, ``"fp32"`` (also ``"half"``, ``"float"``). A ``"torch."``
prefix is ignored, so ``str(torch.bfloat16)`` works too.
"""

from __future__ import annotations

__all__ = ["DTYPE_BYTES", "canonical_dtype", "dtype_bytes"]

#: Bytes per element of each canonical dtype name.
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

_ALIASES: dict[str, str] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def canonical_dtype(dtype: str) -> str:
    """Return the canonical name (``"bfloat16"``, ``"float16"`` or ``"float32"``).

    Raises:
        TypeError: ``dtype`` is not a string.
        ValueError: the name is not one of the accepted names.
    """
    if not isinstance(dtype, str):
        raise TypeError(
            f"dtype must be a string such as 'bfloat16', got {type(dtype).__name__} {dtype!r}"
        )
    key = dtype.strip().lower()
    if key.startswith("torch."):
        key = key[len("torch.") :]
    try:
        return _ALIASES[key]
    except KeyError:
        known = ", ".join(sorted(_ALIASES))
        raise ValueError(f"unknown dtype {dtype!r}: use one of {known}") from None


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (2 for bf16/fp16, 4 for fp32)."""
    return DTYPE_BYTES[canonical_dtype(dtype)]
