"""inkling_vllm: the vLLM adapter and plugin for Inkling's paged short-conv state.

Modules (imported on demand; importing this package imports neither vllm nor torch):

- ``plugin``: the ``vllm.general_plugins`` entry point (``register``);
- ``conv_state``: the per-layer ``SlidingWindowSpec`` layer, the no-op
  ``INKLING_SCONV_SWA`` backend, its metadata builder and the metadata provider;
- ``attention``: the per-layer attention KV-cache layer (full / sliding spec), the
  ``INKLING_REL_ATTN`` backend and its metadata builder;
- ``moe``: the MoE layer (fused routed experts + sink experts);
- ``model``: ``InklingForCausalLM``, the full Inkling text model, from transformers-format
  or release-layout checkpoints;
- ``dispatch``: when to step aside for vLLM's in-tree Inkling;
- ``compat``: supported vLLM versions and the recorded vLLM API the adapter uses;
- ``tiny``, ``parity``, ``diagnostics``, ``main``, ``serve``: the tiny checkpoint,
  the transformers reference, engine introspection, the main job, ``vllm serve``.
"""

__version__ = "0.1.0"
