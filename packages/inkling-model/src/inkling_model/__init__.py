"""inkling_model."""
__version__ = "0.1.0"
