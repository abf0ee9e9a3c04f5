"""FlexAttention kernels for the execution plan (:mod:`lookahead.graph.plan`): attention that visits
only the key blocks a per-(row, head) block mask lists.

A head that runs at some positions only (per-token ``query`` mode) keeps every key, so its active
queries see key prefixes of different lengths — a staircase that stock attention kernels cannot
skip work for. Packed in position order, a block of active queries spans a short run of positions,
so the staircase becomes nearly causal at block level: :func:`packed_query_attention` gives each
query block exactly the key blocks up to its last query's position, and ``mask_mod`` (the query's
original position against the key's) does the rest inside the partial blocks. In decoding,
:func:`decode_attention` gives a (row, head) that is off no key block at all and one that runs only
the blocks it has stored, so a step reads the running heads' keys and values only.

The kernel is compiled (``torch.compile``) once per process (``flex_attention`` has a CPU path through
inductor's C++ template, and a Triton one on GPUs); shapes are kept fixed per call site (queries
padded to the key length, the cache's full capacity as the key length), so a process compiles once
per shape and inductor's on-disk cache serves the next process. :func:`stats` reports the time spent
compiling apart from the steady state. Where compilation fails (no C++ compiler on CPU), the first
call warns and the plan keeps its SDPA paths (:func:`available`).

Which path runs is :data:`ATTENTION` (``auto``, ``flex`` or ``sdpa``; the environment variable
``LOOKAHEAD_ATTENTION``, :func:`set_backend` or :func:`use` set it): ``auto`` takes Flex on GPUs
(:data:`AUTO_DEVICES`; on CPU it does not pay, measured), ``flex`` wherever it applies, ``sdpa``
never. Inference only: no gradient flows through these calls (training runs the general runtime or
the plan's SDPA paths).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import torch

from lookahead.core.errors import LookaheadError

BACKENDS = ("auto", "flex", "sdpa")
BLOCK = 128
"""Query and key block of every block mask (FlexAttention's default)."""

AUTO_DEVICES = ("cuda",)
"""``auto``: the devices that take Flex. Not the CPU: there, at the default model's head dim (32),
its kernel does half the attention of a 50 %-off head in about the time torch's flash kernel takes
for all of it (prefill 0.87 ± 0.00× dense against SDPA's 0.99 ± 0.01 at T = 2048), and in decoding
the block mask and the compiled call's guards cost what reading half the cache saves (1.01 ± 0.07
against 1.04 ± 0.01; ``benchmarks/runtime.py``, README)."""

DECODE_FROM = 512
"""``auto``: decoding takes Flex from this many cached positions (below it a step is launch-bound)."""


class FlexError(LookaheadError, RuntimeError):
    """FlexAttention asked for where it cannot run."""


def _initial() -> str:
    name = os.environ.get("LOOKAHEAD_ATTENTION", "auto")
    if name not in BACKENDS:
        raise FlexError(f"LOOKAHEAD_ATTENTION must be one of {', '.join(BACKENDS)}; got {name!r}")
    return name


ATTENTION = _initial()
_STATS = {"compiles": 0, "compile_s": 0.0, "calls": 0}
_SEEN: set = set()
_WORKS: dict[str, bool] = {}
_KERNEL = None


def set_backend(name: str) -> None:
    """Set :data:`ATTENTION` for the process."""
    global ATTENTION
    if name not in BACKENDS:
        raise FlexError(f"attention must be one of {', '.join(BACKENDS)}; got {name!r}")
    if name == "flex":
        _require()
    ATTENTION = name


@contextlib.contextmanager
def use(name: str):
    """:data:`ATTENTION` = ``name`` inside the block."""
    before = ATTENTION
    set_backend(name)
    try:
        yield
    finally:
        set_backend(before)


def stats() -> dict:
    """Compilations so far (one per new shape), seconds spent in them (first calls, whole), and
    Flex calls made."""
    return dict(_STATS)


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # one compilation per shape (dynamic=False): room for every shape a process meets
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _KERNEL = torch.compile(flex_attention, dynamic=False)
    return _KERNEL


def _require() -> None:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError as err:
        raise FlexError(f"this torch ({torch.__version__}) has no FlexAttention; use attention 'sdpa'") from err


def available(device: torch.device | str) -> bool:
    """Whether Flex is not known to fail on ``device``'s type: the first call there compiles, and a
    compiler failure warns once, returns None (the caller takes its SDPA path) and marks the type."""
    return _WORKS.get(torch.device(device).type, True)


def wanted(kind: str, device: torch.device, positions: int) -> bool:
    """Whether a call of ``kind`` (``prefill`` or ``decode``) over ``positions`` keys on ``device``
    takes Flex under :data:`ATTENTION`. Under ``flex`` on a device type where Flex failed to compile
    it raises :class:`FlexError` (``auto`` takes the SDPA path there)."""
    if ATTENTION == "sdpa" or torch.is_grad_enabled():
        return False
    if ATTENTION == "flex":
        if not available(device):  # it failed earlier (under ``auto``): forced now, an error, not a fallback
            raise FlexError(f"FlexAttention did not compile on {device.type} earlier in this process; "
                            "attention 'sdpa' runs the plan without it")
        return True
    return available(device) and device.type in AUTO_DEVICES and (kind == "prefill" or positions >= DECODE_FROM)


def _call(q, k, v, block_mask, scale):
    """The compiled kernel, or None where it does not compile (``auto``; ``flex`` raises)."""
    kind = q.device.type
    key = (tuple(q.shape), tuple(k.shape), q.dtype, kind)
    first = key not in _SEEN
    tic = time.perf_counter()
    try:
        # keys and values with their own head count: query head h reads key/value head h // group
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        out = _kernel()(q, k, v, block_mask=block_mask, scale=scale, **gqa)
    except Exception as err:  # noqa: BLE001 - a compiler failure: the SDPA paths stay
        if _WORKS.get(kind) or ATTENTION == "flex":
            raise FlexError(f"FlexAttention failed on {kind} ({type(err).__name__}: {err}); "
                            "attention 'sdpa' runs the plan without it") from err
        warnings.warn(f"FlexAttention does not compile on {kind} ({type(err).__name__}: {err}); "
                      "the execution plan keeps its SDPA paths", stacklevel=3)
        _WORKS[kind] = False
        return None
    _WORKS[kind] = True
    if first:
        if kind == "cuda":
            torch.cuda.synchronize()
        _SEEN.add(key)
        _STATS["compiles"] += 1
        _STATS["compile_s"] += time.perf_counter() - tic
    _STATS["calls"] += 1
    return out


def _blocks(first_full: torch.Tensor, last: torch.Tensor, n_kv: int, active: torch.Tensor):
    """(num, indices) of the partial and of the full key blocks of each query block: key blocks
    ``< first_full`` are full (no mask), ``first_full … last`` partial; none where not ``active``."""
    from_full = torch.where(active, first_full, 0)
    upto = torch.where(active, last + 1, 0)
    idx = torch.arange(n_kv, device=last.device, dtype=torch.int32)
    partial = (from_full[..., None] + idx).clamp_max(n_kv - 1).to(torch.int32)
    full = idx.expand(*last.shape, n_kv).contiguous()
    return ((upto - from_full).to(torch.int32).contiguous(), partial.contiguous(),
            from_full.to(torch.int32).contiguous(), full)


def packed_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, active: torch.Tensor,
                           scale: float) -> torch.Tensor | None:
    """Causal attention of the active queries only: q, k, v (B, h, T, D), active (B, h, T) bool →
    (B, h, T, D), 0 where inactive (None: Flex does not compile here). Each (row, head)'s active
    queries are packed in position order (padded to T, so one compiled kernel serves every gate
    pattern of a shape)."""
    from torch.nn.attention.flex_attention import BlockMask

    bsz, h, t, d = q.shape
    n = -(-t // BLOCK)
    if n * BLOCK != t:  # whole blocks; padded keys come after every query's position: never seen
        q, k, v = (torch.nn.functional.pad(y, (0, 0, 0, n * BLOCK - t)) for y in (q, k, v))
        active = torch.nn.functional.pad(active, (0, n * BLOCK - t))
    counts = active.sum(-1)  # (B, h)
    order = torch.sort((~active).to(torch.uint8), dim=-1, stable=True).indices  # active positions first
    slot = torch.arange(n * BLOCK, device=q.device)
    pos = torch.where(slot < counts[..., None], order, -1)  # each slot's position; -1: padding
    qp = torch.gather(q, 2, order[..., None].expand(-1, -1, -1, d))
    # query block j holds slots [jB, (j+1)B): its first and last real positions bound its key blocks
    starts = torch.arange(n, device=q.device) * BLOCK
    busy = starts < counts[..., None]  # (B, h, n): the block holds a real query
    first = torch.gather(pos, 2, starts.expand(bsz, h, n))
    last = torch.gather(pos, 2, torch.minimum(starts + BLOCK, counts[..., None]).sub(1).clamp_min(0))
    num, idx, full_num, full_idx = _blocks(torch.div(first + 1, BLOCK, rounding_mode="floor"),
                                           torch.div(last, BLOCK, rounding_mode="floor"), n, busy)

    def mask(b, hh, qi, ki):
        return pos[b, hh, qi] >= ki

    block_mask = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask,
                                          seq_lengths=(n * BLOCK, n * BLOCK), compute_q_blocks=False)
    out = _call(qp, k, v, block_mask, scale)
    if out is None:
        return None
    z = torch.zeros_like(q)
    keep = (pos >= 0)[..., None]
    z.scatter_(2, order[..., None].expand(-1, -1, -1, d), torch.where(keep, out, 0.0))
    return z[:, :, :t]


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                     on: torch.Tensor, scale: float) -> torch.Tensor | None:
    """One query per (row, head) against its cached keys: q (B, H, D), keys/values (B, H_kv, C, D) the
    cache's whole buffers (C a multiple of :data:`BLOCK`; query head h reads key/value head
    h // (H / H_kv)), lengths (B, H) the keys each query head sees, on (B, H) bool → (B, H, D), 0 where off (None: Flex does not compile here). An off (row, head) visits no key block; one that runs, the
    blocks its keys fill."""
    from torch.nn.attention.flex_attention import BlockMask

    cap = keys.shape[2]
    if cap % BLOCK:
        raise FlexError(f"the cache's capacity must be a multiple of {BLOCK}; got {cap}")
    lengths = lengths.to(torch.int32)
    blocks = torch.where(on & (lengths > 0), -(-lengths // BLOCK), 0)[..., None]  # (B, H, 1)
    full = torch.div(lengths, BLOCK, rounding_mode="floor")[..., None].minimum(blocks)
    n_kv = cap // BLOCK
    num, idx, full_num, full_idx = _blocks(full, blocks - 1, n_kv, blocks > 0)

    def mask(b, h, qi, ki):
        return ki < lengths[b, h]

    block_mask = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask,
                                          seq_lengths=(1, cap), compute_q_blocks=False)
    out = _call(q[:, :, None], keys, values, block_mask, scale)
    if out is None:
        return None
    return torch.where(on[..., None], out[:, :, 0], 0.0)
