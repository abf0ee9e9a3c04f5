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
- a training step stores, per layer and token, 34·d bytes of bf16 activations (Korthikanti et al.
  2022, with fused attention: no T² term; ×2 in fp32) and the logits of its batch (fp32, with their
  softmax gradient: ×2);
- the head-graph runtime (soft topologies: phase 1's cascade, the pairs samples) mixes every head's
  input from the N = 1 + L·H node outputs at every position: N² · d_head more multiply-adds per
  layer and token, and N · d of activations;
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
import json
from typing import Any

PUBLISHED: dict[str, dict[str, int]] = {
    # the hub configs of the models the profiles name (for an estimate without network access)
    "allenai/OLMo-2-0425-1B": {"vocab": 100352, "layers": 16, "heads": 16, "hidden": 2048, "ffn": 8192},
    "Qwen/Qwen3-Embedding-0.6B": {"vocab": 151669, "layers": 28, "heads": 16, "hidden": 1024, "ffn": 3072},
}
GIB = 2**30


@dataclasses.dataclass
class Arch:
    layers: int
    heads: int
    hidden: int
    ffn: int
    vocab: int

    @property
    def body(self) -> int:
        """Parameters of the transformer blocks (attention, MLP, norms)."""
        return self.layers * (4 * self.hidden**2 + 3 * self.hidden * self.ffn + 4 * self.hidden)

    @property
    def params(self) -> int:
        return self.body + 2 * self.vocab * self.hidden + self.hidden

    def forward_flops(self, context: int) -> float:
        """FLOPs per token of one forward at context length ``context`` (causal attention)."""
        return 2 * (self.body + self.vocab * self.hidden) + 2 * self.layers * context * self.hidden

    def graph_flops(self) -> float:
        """Extra FLOPs per token of the soft head-graph runtime (every head's input mixed from N nodes)."""
        n = 1 + self.layers * self.heads
        return 2 * self.layers * n * n * (self.hidden // self.heads)

    def activations(self, tokens: int, dtype_bytes: int, graph: bool = False) -> float:
        """Bytes a training step stores for ``tokens`` tokens (blocks + logits and their gradient)."""
        per_layer = 17 * dtype_bytes * self.hidden + (1 + self.layers * self.heads) * self.hidden * dtype_bytes * graph
        return tokens * (self.layers * per_layer + 2 * 4 * self.vocab)


def _published(model: str) -> Arch | None:
    """The published shape of a hub model the profiles name (:data:`PUBLISHED`), or None."""
    p = PUBLISHED.get(model)
    return Arch(p["layers"], p["heads"], p["hidden"], p["ffn"], p["vocab"]) if p else None


def _arch_of(source: str, model: str | None, revision: str | None, arch: Any, vocab: int) -> tuple[Arch, str]:
    """The base model's shape: ``base.arch`` for a model trained here, else the model's config
    (a local directory, the hub cache, or :data:`PUBLISHED`)."""
    own = Arch(arch.n_layers, arch.n_heads, arch.hidden_size, arch.intermediate_size, vocab)
    if source == "scratch":
        return own, "base.arch"
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model, revision=revision, local_files_only=True)
        return (Arch(cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size, cfg.intermediate_size,
                     cfg.vocab_size), f"{model} config")
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

    def row(self, peak: float) -> dict[str, Any]:
        return {"stage": self.name, "params_trained": self.trained, "params_frozen": self.frozen,
                "forward_tokens": self.forward_tokens, "train_tokens": self.train_tokens, "flops": self.flops,
                "memory_gib": (self.weights + self.optimiser + self.activations) / GIB,
                "weights_gib": self.weights / GIB, "optimiser_gib": self.optimiser / GIB,
                "activations_gib": self.activations / GIB, "hours": self.flops / peak / 3600 if self.flops else 0.0,
                "note": self.note}


def estimate(configs: dict[str, Any], tflops: float = 989.0, mfu: float = 0.4) -> dict[str, Any]:
    """Per-stage figures of validated configs (``lookahead.tools.params.validate_all``)."""
    base, tok = configs["base"], configs["tokenizer"]
    arch, arch_from = _arch_of(base.source, base.model, getattr(base, "revision", None), base.arch, tok.vocab_size)
    peak = tflops * 1e12 * mfu
    t = base.arch.context_length
    lm_w = 4.0 * arch.params
    fwd = arch.forward_flops(t)
    nodes = 1 + arch.layers * arch.heads
    pred, p1, p2, dif, mod = (configs[k] for k in ("predictor", "phase1", "phase2", "diffusion", "modulator"))
    out: list[Stage] = []

    def bytes_of(train_cfg) -> int:
        return 2 if getattr(train_cfg, "precision", "fp32") == "bf16" else 4

    out += [Stage("corpus", note="CPU"), Stage("tokenizer", note="CPU")]
    b = Stage("base", frozen=arch.params, weights=lm_w)
    if base.source == "scratch":
        tr = base.train
        b = Stage("base", trained=arch.params, train_tokens=tr.steps * tr.batch_size * t, weights=lm_w,
                  optimiser=12.0 * arch.params, activations=arch.activations(tr.batch_size * t, bytes_of(tr)))
        b.flops = 3 * fwd * b.train_tokens
    else:
        b.note = f"downloads {lm_w / 1e9:.1f} GB of fp32 weights"
    b.forward_tokens = base.eval_tokens + b.train_tokens
    b.flops += fwd * base.eval_tokens
    b.activations = max(b.activations, 4.0 * base.eval_batch_size * t * arch.vocab)
    out += [b, Stage("wordnet", note="CPU")]

    pr = configs["probe"]
    probe_tokens = pr.head_batches * pr.head_batch_size * pr.head_window + configs["wordnet"].n_anchors * pr.max_text_tokens
    out.append(Stage("probe", frozen=arch.params, forward_tokens=probe_tokens * len(pr.seeds),
                     flops=fwd * probe_tokens * len(pr.seeds), weights=lm_w,
                     activations=4.0 * pr.head_batch_size * pr.head_window * arch.vocab))
    out.append(Stage("init", note="CPU (eigendecomposition of the WordNet matrix)"))

    mt = mod.train
    seq = mod.seq_len or t
    m_tokens = mod.seeds * mt.steps * mt.batch_size * seq
    out.append(Stage("modulator", trained=arch.layers * arch.hidden * 2.0, frozen=arch.params, train_tokens=m_tokens,
                     forward_tokens=m_tokens + 2 * mod.seeds * mod.eval_tokens,
                     flops=2 * fwd * m_tokens + 2 * mod.seeds * mod.eval_tokens * fwd, weights=lm_w,
                     activations=arch.activations(mt.batch_size * seq, bytes_of(mt)),
                     note=f"{mod.seeds} seeds; the LM frozen, gradients through it"))

    cx = configs["contexts"]
    enc = _encoder_params(cx.encoder, arch)
    c_tokens = (cx.train_sequences + cx.val_sequences) * t
    out.append(Stage("contexts", frozen=enc, forward_tokens=c_tokens, flops=2 * enc * c_tokens, weights=4.0 * enc,
                     activations=4.0 * cx.batch_size * t * 1024, note=f"encoder {cx.encoder}"))

    orc = configs["oracle"]
    keep = max(1, round(pred.keep * (nodes - 1)))
    # trial forwards per window (lookahead.graph.oracle.greedy_trials, written out here to keep torch out)
    heads, steps = nodes - 1, -(-(nodes - 1 - keep) // orc.per_round)
    removals = (heads + sum(min(orc.candidates, heads - s * orc.per_round) for s in range(1, steps)) if orc.candidates
                else max(steps, 1) * heads)
    o_tokens = orc.windows * (removals + 1) * t
    out.append(Stage("oracle", frozen=arch.params, forward_tokens=o_tokens, flops=fwd * o_tokens, weights=lm_w,
                     activations=4.0 * orc.rows * t * arch.vocab,
                     note=f"greedy to {keep} of {heads} heads (per_round {orc.per_round}, candidates "
                          f"{orc.candidates or 'all'}): {removals} forwards per window"))

    # the router: an MLP from the context features to rank-r node factors
    ctx_dim = {"cache": 384 if cx.encoder == "minilm" else 1024, "lm": 2 * arch.hidden, "embedding": arch.hidden,
               "layer": arch.hidden}[pred.input]
    router = ctx_dim * pred.hidden + pred.hidden * 2 * nodes * pred.rank
    graph = pred.gate == "cascade" or pred.edges == "learned"
    p1_fwd = fwd + (arch.graph_flops() if graph else 0)
    pt = p1.train
    p1_tokens = p1.seeds * pt.steps * pt.batch_size * t
    out.append(Stage("phase1", trained=router, frozen=arch.params, train_tokens=p1_tokens, forward_tokens=p1_tokens,
                     flops=2 * p1_fwd * p1_tokens, weights=lm_w + 4.0 * router, optimiser=12.0 * router,
                     activations=arch.activations(pt.batch_size * t, bytes_of(pt), graph),
                     note=f"{p1.seeds} seeds; {'soft head graph' if graph else 'head gates'}"))

    pa = configs["pairs"]
    if pa.target == "eps_good":
        per_window = 1 + pa.rounds * 64
        pa_tokens = (pa.sequences + pa.val_sequences) * per_window * t
        pa_note = f"{per_window} candidate keep sets per position"
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
                     activations=4.0 * dt.batch_size * nodes * dn.hidden * dn.layers * 4,
                     note=f"{dif.seeds} seeds; pairs, not tokens: the LM only in evaluation"))

    qt = p2.train
    rows = qt.batch_size * (2 if p2.replay else 1)
    q_tokens = p2.seeds * qt.steps * rows * t
    p2_act = arch.activations(rows * t, bytes_of(qt), p2.connectivity != "none")
    out.append(Stage("phase2", trained=arch.params + router, train_tokens=q_tokens, forward_tokens=q_tokens,
                     flops=3 * fwd * q_tokens, weights=lm_w + 4.0 * router, optimiser=12.0 * (arch.params + router),
                     activations=p2_act, note=f"{p2.seeds} seeds; the LM and the router train"
                     + ("; replay doubles each step's windows" if p2.replay else "")))
    for name in ("control", "static_control"):
        out.append(Stage(name, trained=arch.params, train_tokens=q_tokens, forward_tokens=q_tokens, flops=3 * fwd * q_tokens,
                         weights=lm_w, optimiser=12.0 * arch.params, activations=p2_act,
                         note=f"{p2.seeds} seeds; phase 2's settings"))

    ev, sc = configs["evaluate"], configs["scoring"]
    rows_ev = 12 + 2 * ev.diffusion_samples + ev.random_draws  # dense, routed, controls, static, samples, random draws
    e_tokens = ev.seeds * rows_ev * (sc.windows + cx.val_sequences) * t
    out.append(Stage("evaluate", frozen=3 * arch.params, forward_tokens=e_tokens, flops=fwd * e_tokens,
                     weights=3 * lm_w, activations=4.0 * ev.eval_batch_size * t * arch.vocab,
                     note=f"{ev.seeds} seeds x ~{rows_ev} rows over {sc.windows + cx.val_sequences} windows; "
                          "three LMs loaded (base, phase 2, control)"))

    table = [s.row(peak) for s in out]
    return {"arch": dataclasses.asdict(arch), "arch_from": arch_from, "params": arch.params, "context": t,
            "tflops": tflops, "mfu": mfu, "stages": table,
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
             f"{est['tflops']:g} TFLOP/s at {est['mfu']:.0%} MFU",
             f"{'stage':<15}{'trained':>9}{'frozen':>9}{'fwd tok':>9}{'train tok':>10}{'FLOPs':>9}"
             f"{'weights':>9}{'optim':>8}{'activ':>8}{'GiB':>7}{'hours':>8}  note"]
    for r in est["stages"]:
        lines.append(f"{r['stage']:<15}{_num(r['params_trained']):>9}{_num(r['params_frozen']):>9}"
                     f"{_num(r['forward_tokens']):>9}{_num(r['train_tokens']):>10}{_num(r['flops']):>9}"
                     f"{r['weights_gib']:>9.1f}{r['optimiser_gib']:>8.1f}{r['activations_gib']:>8.1f}"
                     f"{r['memory_gib']:>7.1f}{r['hours']:>8.2f}  {r['note']}")
    lines.append(f"total {est['total_hours']:.1f} GPU-hours at the stated throughput; the largest stage needs "
                 f"{est['peak_memory_gib']:.0f} GiB on one GPU (more: lower its batch size, or accelerate launch)")
    return "\n".join(lines)


def main_estimate(configs: dict[str, Any], tflops: float, mfu: float, as_json: bool) -> str:
    est = estimate(configs, tflops, mfu)
    return json.dumps(est) if as_json else render(est)
