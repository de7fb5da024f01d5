"""inkling_cache."""
__version__ = "0.1.0"
