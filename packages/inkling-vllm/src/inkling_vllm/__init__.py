"""inkling_vllm."""
__version__ = "0.1.0"
