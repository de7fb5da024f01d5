"""inkling_vllm: the vLLM adapter and plugin for Inkling's paged short-conv state.

Modules (imported on demand; importing this package imports neither vllm nor torch):

- ``plugin``: the ``vllm.general_plugins`` entry point (``register``);
- ``conv_state``: the per-layer ``SlidingWindowSpec`` layer, the no-op
  ``INKLING_SCONV_SWA`` backend, its metadata builder and the metadata provider;
- ``model``: ``InklingForCausalLM`` for transformers-format checkpoints (dense,
  relative-logit-free subset);
- ``compat``: supported vLLM versions and the recorded vLLM API the adapter uses;
- ``tiny``, ``parity``, ``diagnostics``, ``main``, ``serve``: the tiny checkpoint,
  the transformers reference, engine introspection, the main job, ``vllm serve``.
"""

__version__ = "0.1.0"
