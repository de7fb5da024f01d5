"""Drive vLLM's own ``KVCacheManager`` with a conv-state group and check every row.

Used by the tests and by ``benchmarks/run.py conv-memory``. A small scheduler loop stands in
for vLLM's (which forces synchronous scheduling on CPU): it calls
``KVCacheManager.allocate_slots`` as vLLM's scheduler does (admission gate on the
first chunk, chunked prefill under a token budget, decode, n-gram-style drafts with
rejections), keeps ``batches`` steps in flight (``num_in_flight_tokens`` as vLLM
counts it) and runs each step when it leaves the queue.

"Running" a step is an independent model of the conv kernel's cache traffic: a
worker-side block table (block ids appended as the scheduler hands them out; stale
ids stay after a free, as in vLLM's worker), a store ``slot -> (position, prefix
digest)``, the step's reads (the ``W - 1`` rows before its first token, through the
table) checked against what the reader's own tokens say must be there, and its
writes (rows in the null block are skipped: slot ``-1``). A read of a row that was
never stored, was overwritten, or sits in a block the request no longer holds raises
:class:`RowLost`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

from ..conv_manager import ConvStateSpec

__all__ = [
    "RowLost", "SimConfig", "SimResult", "Worker", "conv_spec", "make_manager", "run_shared_prefix", "run_sim",
]


class RowLost(AssertionError):
    """A step read a conv row the cache no longer (or never) held."""


def conv_spec(
    manager: str,
    *,
    block_size: int = 4,
    kernel: int = 4,
    spec_tokens: int = 0,
    lookahead: int = 0,
    batches: int = 1,
    retention: int = 0,
    spec_cls: type[ConvStateSpec] = ConvStateSpec,
) -> SlidingWindowSpec:
    """The conv group's spec as the layer emits it (tiny page); ``lookahead``: the slots
    an EAGLE-style drafter has vLLM allocate past each step (its layers write them, not
    the conv's)."""
    common: dict[str, Any] = dict(
        block_size=block_size, num_kv_heads=1, head_size=8, head_size_v=0,
        dtype=torch.float32, sliding_window=kernel,
    )
    if manager == "window":
        return SlidingWindowSpec(**common)
    return spec_cls(
        **common, spec_tokens=spec_tokens, lookahead_tokens=lookahead, concurrent_batches=batches,
        retention_tokens=retention,
    )


def make_manager(
    spec: KVCacheSpec,
    *,
    num_blocks: int,
    max_model_len: int,
    max_in_flight_tokens: int,
    attention_block: int | None = None,
    enable_caching: bool = True,
    use_eagle: bool = False,
) -> KVCacheManager:
    """vLLM's ``KVCacheManager`` over one conv group (group 0) and, optionally, a
    full-attention group (group 1) that sets the hit alignment; ``use_eagle``: an
    EAGLE-style drafter's engine (vLLM's hit search drops the last matched block)."""
    groups = [KVCacheGroupSpec(["conv"], spec)]
    sizes = [spec.block_size]
    if attention_block is not None:
        attn = FullAttentionSpec(block_size=attention_block, num_kv_heads=1, head_size=8, dtype=torch.float32)
        groups.append(KVCacheGroupSpec(["attn"], attn))
        sizes.append(attention_block)
    align = math.lcm(*sizes)
    config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
        prefix_cache_retention_interval=0,  # the engine default (CacheConfig)
    )
    return KVCacheManager(
        config,
        max_model_len=max_model_len,
        scheduler_block_size=align,
        hash_block_size=math.gcd(*sizes),
        max_in_flight_tokens=max_in_flight_tokens,
        enable_caching=enable_caching,
        use_eagle=use_eagle,
    )


_HASHER_READY: dict[int, Any] = {}


def _block_hasher(block_size: int) -> Any:
    if block_size not in _HASHER_READY:
        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        _HASHER_READY[block_size] = get_request_block_hasher(block_size, fn)
    return _HASHER_READY[block_size]


def _chain(prev: bytes, token: int) -> bytes:
    """Digest of a token prefix, from the digest of the prefix one shorter."""
    return hashlib.blake2b(prev + token.to_bytes(8, "little", signed=True), digest_size=12).digest()


@dataclass
class SimConfig:
    """One simulated request's schedule (prompt, step budget, drafts, preemption,
    streaming turns) and the conv manager, block size and pool it runs on."""

    prompt_len: int
    budget: int
    decode_steps: int = 32
    spec_k: int = 0
    # where drafts come from: "ngram" (the tokens: no lookahead slots) or "eagle" (a
    # drafter with its own layers: vLLM allocates spec_k lookahead slots past every step
    # and its hit search drops the last matched block)
    spec_method: str = "ngram"
    batches: int = 1
    block_size: int = 4
    kernel: int = 4
    manager: str = "tail"
    retention: int = 0
    num_blocks: int = 40000
    max_model_len: int = 65536
    attention_block: int | None = None
    seed: int = 0
    enable_caching: bool = True
    spec_cls: type[ConvStateSpec] = ConvStateSpec
    # preempt the request after this many decode steps (vLLM frees its blocks and
    # recomputes prompt + output as a new prefill, drafts cleared); None: never
    preempt_after: int | None = None
    # a streaming-input session (vLLM's resumable requests): after this many decode
    # steps the turn stops and the session continues with ``continue_tokens`` new
    # prompt tokens, keeping its blocks (a prefill after decode steps); None: never
    continue_after: int | None = None
    continue_tokens: int = 0
    # with steps in flight when the turn stops (async scheduling), vLLM runs the newest
    # one but drops its output and resumes at the frontier before it (the computed
    # tokens less the in-flight ones); False: every step settles first
    continue_drops_in_flight: bool = False


@dataclass
class SimResult:
    """Per schedule: the conv blocks held, the rows still read, and the fewest blocks
    holding those rows."""

    held: list[int] = field(default_factory=list)  # conv blocks held after each schedule
    # rows some scheduled or next step still reads after each schedule: the W-1 rows
    # before each in-flight step, and the W-1 (+k after a decode step with k drafts)
    # before the end of the last scheduled step; prefix-cache checkpoints not counted
    needed: list[int] = field(default_factory=list)
    # the fewest blocks that hold those rows (the blocks they sit in): what any
    # position-indexed cache with this block size must hold at that step
    needed_blocks: list[int] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)  # "prefill" / "decode"
    admission: int = 0  # blocks the admission gate asked the conv group for
    cap: int = 0  # the spec's admission cap
    reads_checked: int = 0
    hit: int = 0  # prefix-cache hit length (tokens)
    junction: int = 0  # the shared-prefix boundary vLLM pinned for the request (0: none)
    tokens: list[int] = field(default_factory=list)  # prompt + output at the end


class Worker:
    """The conv kernel's cache traffic, modelled independently of the manager."""

    def __init__(self, manager: KVCacheManager, block_size: int, kernel: int) -> None:
        self.manager = manager
        self.n = block_size
        self.reach = kernel - 1
        self.table: dict[str, list[int]] = {}
        self.store: dict[int, tuple[int, bytes]] = {}
        self.reads = 0
        self.chains: dict[str, list[bytes]] = {}  # digests of each request's token prefixes

    def _prefix_digests(self, req: Request, upto: int) -> list[bytes]:
        chain = self.chains.setdefault(req.request_id, [])
        tokens = req.all_token_ids
        while len(chain) < upto:
            chain.append(_chain(chain[-1] if chain else b"", tokens[len(chain)]))
        return chain

    def update(self, rid: str, block_ids: list[int], new_request: bool) -> None:
        if new_request:
            self.table[rid] = list(block_ids)
        else:
            self.table.setdefault(rid, []).extend(block_ids)

    def run(self, req: Request, start: int, tokens: list[int]) -> None:
        """Run one step of ``req``: positions ``start..start+len(tokens)-1``."""
        rid = req.request_id
        table = self.table[rid]
        held = self.manager.coordinator.single_type_managers[0].req_to_blocks.get(rid, [])
        chain = self._prefix_digests(req, start)
        for q in range(max(0, start - self.reach), start):
            b = q // self.n
            if b >= len(table) or table[b] == 0:
                raise RowLost(f"{rid}: step at {start} reads row {q}: block {b} is null in the table")
            if b >= len(held) or held[b].is_null or held[b].block_id != table[b]:
                raise RowLost(f"{rid}: step at {start} reads row {q}: block {b} is no longer held")
            got = self.store.get(table[b] * self.n + q % self.n)
            want = (q, chain[q])
            if got != want:
                raise RowLost(f"{rid}: step at {start} reads row {q}: stored {got!r} != {want!r}")
            self.reads += 1
        digest = chain[start - 1] if start > 0 else b""
        for i, token in enumerate(tokens):
            p = start + i
            digest = _chain(digest, token)
            b = p // self.n
            if table[b] == 0:
                continue  # slot -1: not stored
            self.store[table[b] * self.n + p % self.n] = (p, digest)


def _rows_still_read(inflight: deque[tuple[int, int, bool]], reach: int, spec_k: int) -> set[int]:
    """How many positions some step still reads: those before each in-flight step
    (``reach`` = W-1 rows) and those the step after the last one may read (its start
    is not known under drafts: up to ``spec_k`` rows earlier)."""
    rows: set[int] = set()
    for start, _, _ in inflight:
        rows.update(range(max(0, start - reach), start))
    start, n, is_decode = inflight[-1]
    end = start + n
    rows.update(range(max(0, end - reach - (spec_k if is_decode else 0)), end))
    return rows


def _continue_session(
    req: Request, new_tokens: list[int], hash_block: int, settle: Any, inflight: deque[Any],
    worker: Worker, drop_newest: bool,
) -> None:
    """What vLLM's scheduler does when a streaming-input session's turn stops and its
    next input arrives (``_handle_stopped_request``, ``_update_request_as_session``):
    the steps in flight settle (with ``drop_newest``, the newest runs, its rows stored,
    but its output is dropped and the computed tokens fall back before it), the last
    sampled token (never computed) is dropped, the computed outputs and the new tokens
    join the prompt, and the request waits again holding its blocks, to resume at its
    computed tokens."""
    while len(inflight) > (1 if drop_newest else 0):
        settle()
    if inflight:
        start, n, _ = inflight.popleft()
        req.num_in_flight_tokens -= n
        worker.run(req, start, list(req.all_token_ids[start:start + n]))
        req.num_computed_tokens -= n
    computed = req.num_computed_tokens
    del req._all_token_ids[computed:]
    kept = list(req._all_token_ids[req.num_prompt_tokens:computed])
    req._output_token_ids.clear()
    req.spec_token_ids = []
    assert req.prompt_token_ids is not None
    req.prompt_token_ids.extend(kept + new_tokens)
    req._all_token_ids.extend(new_tokens)
    del req.block_hashes[computed // hash_block:]
    req.update_block_hashes()
    req.num_prompt_tokens = len(req.prompt_token_ids)


def run_sim(
    cfg: SimConfig,
    manager: KVCacheManager | None = None,
    worker: Worker | None = None,
    prompt: list[int] | None = None,
    request_id: str = "r0",
) -> SimResult:
    """One request: admission, chunked prefill, ``decode_steps`` decode steps
    (with ``spec_k`` drafts each, a seeded share rejected), ``batches`` in flight.
    Pass the ``manager`` and ``worker`` of an earlier run (and a ``prompt``) to
    follow a request with another that hits its prefix."""
    rng = random.Random(cfg.seed)
    if cfg.spec_method not in ("ngram", "eagle"):
        raise ValueError(f"spec_method {cfg.spec_method!r}: 'ngram' or 'eagle'")
    lookahead = cfg.spec_k if cfg.spec_method == "eagle" else 0
    spec = conv_spec(
        cfg.manager, block_size=cfg.block_size, kernel=cfg.kernel, spec_tokens=cfg.spec_k,
        lookahead=lookahead, batches=cfg.batches, retention=cfg.retention, spec_cls=cfg.spec_cls,
    )
    in_flight_max = cfg.batches * cfg.budget
    if manager is None:
        manager = make_manager(
            spec, num_blocks=cfg.num_blocks, max_model_len=cfg.max_model_len,
            max_in_flight_tokens=in_flight_max, attention_block=cfg.attention_block,
            enable_caching=cfg.enable_caching, use_eagle=cfg.spec_method == "eagle" and cfg.spec_k > 0,
        )
    if worker is None:
        worker = Worker(manager, cfg.block_size, cfg.kernel)
    if prompt is None:
        prompt = [rng.randrange(1, 30000) for _ in range(cfg.prompt_len)]
    hash_block = math.gcd(cfg.block_size, cfg.attention_block or cfg.block_size)
    req = Request(
        request_id, prompt, SamplingParams(max_tokens=cfg.decode_steps * (cfg.spec_k + 1) + 8), None,
        block_hasher=_block_hasher(hash_block),
    )
    res = SimResult(cap=int(getattr(spec, "max_admission_blocks_per_request")(in_flight_max, cfg.max_model_len)))
    rid = req.request_id
    conv = manager.coordinator.single_type_managers[0]

    # as vLLM's scheduler does for a request scheduled from zero computed tokens
    computed_blocks, num_hit, req.shared_prefix_boundary = manager.get_computed_blocks(req)
    res.junction = req.shared_prefix_boundary
    res.admission = conv.get_num_blocks_to_allocate(
        rid, min(req.num_tokens, cfg.max_model_len), computed_blocks.blocks[0], num_hit, num_hit,
        min(req.num_tokens, cfg.max_model_len), apply_admission_cap=True,
        prefill_end=max(req.num_prompt_tokens, req.num_tokens - 1),  # as vLLM's allocate_slots passes it
    )
    inflight: deque[tuple[int, int, bool]] = deque()  # (start, n, is_decode)
    decode_done = 0
    first = True
    prefill_target = req.num_prompt_tokens  # the prompt; after a preemption, every token
    preempted = continued = False
    gate = True  # the admission gate: a waiting request's first chunk

    def settle() -> None:
        nonlocal decode_done
        start, n, is_decode = inflight.popleft()
        req.num_in_flight_tokens -= n
        if not is_decode:
            worker.run(req, start, list(req.all_token_ids[start:start + n]))
            if start + n == prefill_target:
                req.append_output_token_ids(rng.randrange(1, 30000))
            return
        # decode: the input token plus n - 1 drafts; accept a seeded prefix
        drafts = [rng.randrange(1, 30000) for _ in range(n - 1)]
        accepted = rng.randrange(0, n) if n > 1 else 0
        worker.run(req, start, [req.all_token_ids[start], *drafts])
        new = drafts[:accepted] + [rng.randrange(1, 30000)]
        req.num_computed_tokens -= (n - 1) - accepted
        req.append_output_token_ids(new)
        decode_done += 1

    while decode_done < cfg.decode_steps:
        if cfg.preempt_after is not None and not preempted and decode_done >= cfg.preempt_after:
            # vLLM's preemption: settle what is in flight, free every block, restart
            # from zero (a prefix hit may shorten the recompute), drafts dropped
            while inflight:
                settle()
            manager.free(req)
            req.num_computed_tokens = 0
            prefill_target = req.num_tokens
            computed_blocks, num_hit, req.shared_prefix_boundary = manager.get_computed_blocks(req)
            first, preempted = True, True
            continue
        if cfg.continue_after is not None and not continued and decode_done >= cfg.continue_after:
            new_tokens = [rng.randrange(1, 30000) for _ in range(cfg.continue_tokens)]
            _continue_session(req, new_tokens, hash_block, settle, inflight, worker, cfg.continue_drops_in_flight)
            prefill_target = req.num_tokens
            continued = gate = True
            continue
        done = req.num_computed_tokens + (num_hit if first else 0)
        prefill = done < prefill_target
        if prefill:
            n = min(cfg.budget, prefill_target - done)
        else:
            # drafts need the previous step's output: spec decode waits for it (a
            # plain decode step runs after its predecessor and reads its token then)
            if inflight and cfg.spec_k > 0:
                settle()
                continue
            n = 1 + cfg.spec_k
        start = req.num_computed_tokens
        blocks = manager.allocate_slots(
            req, n,
            num_new_computed_tokens=num_hit if first else 0,
            new_computed_blocks=computed_blocks if first else None,
            num_lookahead_tokens=lookahead,
            full_sequence_must_fit=gate,
        )
        gate = False
        if blocks is None:
            raise RuntimeError(f"allocation failed at computed={start} (pool too small?)")
        if first:
            ids = list(manager.get_blocks(rid).get_block_ids()[0])
            worker.update(rid, ids, True)
            start = req.num_computed_tokens + num_hit
            req.num_computed_tokens = start
            first = False
        else:
            worker.update(rid, blocks.get_block_ids()[0], False)
        req.num_computed_tokens += n
        req.num_in_flight_tokens += n
        inflight.append((start, n, not prefill))
        res.held.append(sum(1 for b in conv.req_to_blocks.get(rid, []) if not b.is_null))
        still_read = _rows_still_read(inflight, cfg.kernel - 1, cfg.spec_k)
        res.needed.append(len(still_read))
        res.needed_blocks.append(len({row // cfg.block_size for row in still_read}))
        res.phase.append("prefill" if prefill else "decode")
        if len(inflight) >= cfg.batches:
            settle()
    while inflight:
        settle()
    res.reads_checked = worker.reads
    res.hit = num_hit
    res.tokens = list(req.all_token_ids)
    manager.free(req)
    return res


def run_shared_prefix(cfg: SimConfig, shared: int | None = None) -> list[SimResult]:
    """The shared-prefix junction, one request after another on one manager: request 1
    has a ``cfg.prompt_len``-token prompt; request 2 shares its first ``shared`` tokens
    (half the prompt by default) and goes on with its own; request 3 shares them again,
    after request 2. Request 2's attention layers hit the shared prefix that request 1
    cached, the conv group does not (no checkpoint there): vLLM pins that junction
    (``shared_prefix_boundary``) so request 3 can hit it. Pass ``cfg.attention_block``:
    the junction comes from the attention group's longer hit. Returns the three runs
    (``hit``: each one's cached tokens)."""
    if cfg.attention_block is None:
        raise ValueError("run_shared_prefix needs cfg.attention_block: a junction comes from an attention group")
    shared = cfg.prompt_len // 2 if shared is None else shared
    rng = random.Random(cfg.seed + 1)
    spec = conv_spec(
        cfg.manager, block_size=cfg.block_size, kernel=cfg.kernel, spec_tokens=cfg.spec_k,
        lookahead=cfg.spec_k if cfg.spec_method == "eagle" else 0, batches=cfg.batches,
        retention=cfg.retention, spec_cls=cfg.spec_cls,
    )
    manager = make_manager(
        spec, num_blocks=cfg.num_blocks, max_model_len=cfg.max_model_len,
        max_in_flight_tokens=cfg.batches * cfg.budget, attention_block=cfg.attention_block,
        enable_caching=cfg.enable_caching, use_eagle=cfg.spec_method == "eagle" and cfg.spec_k > 0,
    )
    worker = Worker(manager, cfg.block_size, cfg.kernel)
    first = [rng.randrange(1, 30000) for _ in range(cfg.prompt_len)]
    prompts = [first] + [
        first[:shared] + [rng.randrange(1, 30000) for _ in range(cfg.prompt_len - shared)] for _ in range(2)
    ]
    return [
        run_sim(cfg, manager=manager, worker=worker, prompt=prompt, request_id=f"r{i}")
        for i, prompt in enumerate(prompts)
    ]
