"""The geometric residual modulator against stock HF forwards and a layer-by-layer reference, and
the modulator stage on tiny inputs (real WordNet glosses and path similarities)."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.pipeline.modulator.build import build_modulator, nll_claim
from lookahead.pipeline.modulator.config import AlignmentConfig, ModulatorConfig, ModulatorError
from lookahead.pipeline.modulator.model import GeometricModulator, load_modulator
from tests.conftest import save_tiny_lm

N_GEO = 4
SYNSETS = ["dog.n.01", "cat.n.01", "wolf.n.01", "car.n.01", "bicycle.n.01", "oak.n.02", "rose.n.01", "hammer.n.02",
           "river.n.01", "mountain.n.01", "teacher.n.01", "violin.n.01"]


def reference_logits(lm, ids, sites: dict[int, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """Written out block by block, apart from the modulator's hooks: before block l in ``sites``,
    h ← (1 − w) h + w target with w = sites[l] (B, T, 1)."""
    m = lm.model
    h = m.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    rope = m.rotary_emb(h, position_ids=pos)
    for layer, block in enumerate(m.layers):
        if layer in sites:
            h = (1 - sites[layer]) * h + sites[layer] * target
        h = block(h, attention_mask=None, position_embeddings=rope, position_ids=pos)
    return lm.lm_head(m.norm(h))


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("modulator_lm")
    save_tiny_lm(d / "lm", tiny_tokenizer, hidden=16, n_layers=3, n_heads=2, seed=3)
    lm = AutoModelForCausalLM.from_pretrained(d / "lm", dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    vocab = lm.config.vocab_size
    mask = (torch.rand(vocab, generator=gen) > 0.4).float()
    parts = {"table": torch.randn(vocab, N_GEO, generator=gen), "mask": mask,
             "projection": torch.randn(N_GEO, 16, generator=gen), "pca_mean": torch.randn(16, generator=gen)}
    ids = torch.randint(2, vocab, (3, 10), generator=gen)
    return lm, parts, ids, d / "lm"


def modulator(parts, layers, **cfg):
    return GeometricModulator(parts["table"], parts["mask"], parts["projection"], parts["pca_mean"], 1.7, layers,
                              ModulatorConfig(**cfg))


def test_alpha_zero_gives_the_stock_logits_exactly(tiny):
    lm, parts, ids, _ = tiny
    with torch.no_grad():
        stock = lm(input_ids=ids).logits
        zero = modulator(parts, [0, 1, 2], alpha_mode="fixed", alpha_init=0.0)(lm, ids).logits
        some = modulator(parts, [0, 1, 2], alpha_mode="fixed", alpha_init=0.2)(lm, ids).logits
    assert torch.equal(zero, stock)
    assert (some - stock).abs().max() > 1e-2  # the same call with α > 0 does change them


@pytest.mark.parametrize("kind", ["plain", "pca"])
def test_modulated_logits_equal_the_block_by_block_reference(tiny, kind):
    lm, parts, ids, _ = tiny
    mod = modulator(parts, [0, 2], target=kind)
    with torch.no_grad():
        mod.alpha_logit.copy_(torch.logit(torch.tensor([0.3, 0.6])))
        target = parts["table"][ids] @ parts["projection"]  # the seed's formula, geo(x) P
        if kind == "pca":  # the point the Procrustes fit maps geo(x) to
            target = parts["pca_mean"] + 1.7 * target
        w = parts["mask"][ids][..., None]
        assert torch.allclose(reference_logits(lm, ids, {}, target), lm(input_ids=ids).logits, atol=1e-6)  # the reference is stock when unmodulated
        expected = reference_logits(lm, ids, {0: 0.3 * w, 2: 0.6 * w}, target)
        got = mod(lm, ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    # the hooks are gone after the call: the LM is stock again
    assert torch.equal(lm(input_ids=ids).logits, lm(input_ids=ids).logits) and not lm.model.layers[0]._forward_pre_hooks


def test_a_token_without_a_wordnet_match_gets_no_nudge(tiny):
    lm, parts, ids, _ = tiny
    unmatched = int(torch.nonzero(parts["mask"] == 0)[0])
    matched = int(torch.nonzero(parts["mask"] == 1)[0])
    seq = torch.tensor([[unmatched, unmatched, matched, unmatched]])
    with torch.no_grad():
        stock = lm(input_ids=seq).logits
        got = modulator(parts, [0, 1, 2], alpha_mode="fixed", alpha_init=0.5)(lm, seq).logits
    assert torch.equal(got[:, :2], stock[:, :2])  # causal: positions before the first matched token are untouched
    assert (got[:, 2:] - stock[:, 2:]).abs().max() > 1e-3


def test_shared_alpha_and_gradients_reach_only_the_trainable_parts(tiny):
    lm, parts, ids, _ = tiny
    lm.requires_grad_(False)
    mod = modulator(parts, [1, 2], alpha_shared=True, train_projection=True)
    assert mod.alpha_logit.shape == (1,) and torch.allclose(mod.alphas(), torch.full((2,), 0.01))
    F.cross_entropy(mod(lm, ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert mod.alpha_logit.grad is not None and mod.projection.grad is not None
    assert mod.table.grad is None and all(p.grad is None for p in lm.parameters())


def test_config_refusals_name_the_key():
    for values, key in (({"layers": []}, "layers"), ({"layers": [0, 0]}, "layers"), ({"layers": [-1]}, "layers"),
                        ({"alpha_init": 0.0}, "alpha_init"), ({"alpha_init": float("nan")}, "alpha_init"),
                        ({"alpha_mode": "fixed", "alpha_init": 1.5}, "alpha_init"), ({"alpha_mode": "static"}, "alpha_mode"),
                        ({"eval_tokens": -1}, "eval_tokens"), ({"layers": "some"}, "layers"), ({"alphas": 1}, "alphas"),
                        ({"kind": "fields"}, "kind"), ({"kind": "field", "train_table": True}, "train_table"),
                        ({"kind": "field", "alpha_mode": "fixed", "alpha_init": 0.5}, "alpha_init"),
                        ({"field": {"experts": [4], "edim": 4}}, "field.edim"),
                        ({"field": {"experts": [1, 1]}}, "field.experts"), ({"field": {"null_fraction": 1.0}}, "field.null_fraction"),
                        ({"field": {"cv_band": [0.3, 0.2]}}, "field.cv_band")):
        with pytest.raises(ConfigError) as err:
            from_dict(ModulatorConfig, values)
        assert err.value.key.startswith(key), (values, err.value.key)
    assert from_dict(ModulatorConfig, {"alpha_mode": "fixed", "alpha_init": 0.0}).trains is False
    assert from_dict(ModulatorConfig, {"kind": "field", "alpha_mode": "fixed", "alpha_init": 0.29154}).trains  # the gates


@pytest.fixture(scope="module")
def stage_inputs(tiny, wn, tmp_path_factory):
    """A tiny base model directory, token streams, an init file and a wordnet directory of real
    synsets (glosses, lemmas, nltk path similarities of every pair)."""
    from safetensors.torch import save_file

    lm, parts, _, lm_dir = tiny
    d = tmp_path_factory.mktemp("modulator_stage")
    shutil.copytree(lm_dir, d / "base")
    rng = np.random.default_rng(0)
    (d / "tokens").mkdir()
    vocab = lm.config.vocab_size
    np.save(d / "tokens" / "train.npy", rng.integers(2, vocab, 3000).astype(np.uint16))
    np.save(d / "tokens" / "val.npy", rng.integers(2, vocab, 800).astype(np.uint16))
    comps = torch.linalg.qr(torch.randn(16, N_GEO, generator=torch.Generator().manual_seed(5)))[0].T  # (n_geo, d) orthonormal rows
    save_file({"geo_table": parts["table"], "geo_mask": parts["mask"], "projection": parts["projection"],
               "pca_mean": parts["pca_mean"], "pca_components": comps.contiguous()}, str(d / "init.safetensors"))
    (d / "wordnet").mkdir()
    synsets = [wn.synset(name) for name in SYNSETS]
    rows = ["lemma\tsynset\tpos\ttoken_id\tgloss"] + [
        f"{s.lemma_names()[0]}\t{s.name()}\tn\t{10 + i}\t{s.definition()}" for i, s in enumerate(synsets)]
    (d / "wordnet" / "anchors.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = ["i\tj\tpath_similarity\twup"] + [f"{i}\t{j}\t{synsets[i].path_similarity(synsets[j])}\t0"
                                              for i, j in itertools.combinations(range(len(synsets)), 2)]
    (d / "wordnet" / "eval_pairs.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    return d


def stage_config(**values) -> ModulatorConfig:
    return from_dict(ModulatorConfig, {"seq_len": 32, "eval_tokens": 200, "eval_batch_size": 2, **values,
                                       "train": {"steps": 3, "batch_size": 2, "lr": 0.5, "warmup_steps": 1,
                                                 "eval_every": 2, "log_every": 1, "checkpoint_every": 2, "device": "cpu"}})


ALIGN = AlignmentConfig(seeds=[0, 1], pentachora=20, chain_depth=2, max_text_tokens=16, encode_batch_size=4)


def val_nll_by_hand(lm, d, sites_alpha: dict[int, float] | None = None) -> float:
    """Mean NLL of the first 200 val tokens (6 windows of 32 + 1, stride 32), through the reference
    forward with the init file's table and projection (target geo(x) P) at ``sites_alpha``."""
    from safetensors.torch import load_file

    stream = torch.from_numpy(np.load(d / "tokens" / "val.npy").astype(np.int64))
    windows = torch.stack([stream[s : s + 33] for s in range(0, 6 * 32, 32)])
    ids, targets = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        if sites_alpha is None:
            logits = lm(input_ids=ids).logits
        else:
            init = load_file(str(d / "init.safetensors"))
            target = init["geo_table"][ids] @ init["projection"]
            w = init["geo_mask"][ids][..., None]
            logits = reference_logits(lm, ids, {layer: a * w for layer, a in sites_alpha.items()}, target)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()


def test_the_stage_measures_before_and_after_and_trains_only_alpha(tiny, stage_inputs, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from lookahead.artifacts.wordnet_tables import read_tsv
    from lookahead.lm.encoders import encode_texts
    from lookahead.semantics.alignment import relational_alignment

    lm, _, _, _ = tiny
    d = stage_inputs
    cfg = stage_config(layers=[1, 2])
    report, result, alpha_rows = build_modulator(cfg, ALIGN, d / "base", d / "tokens", d / "wordnet", None,
                                                 d / "init.safetensors", tmp_path / "out", tmp_path / "ckpt")
    # before: the stock model, scored and measured as the probe stage does
    assert report["val_nll_before"] == pytest.approx(val_nll_by_hand(lm, d), rel=1e-6)
    anchors = read_tsv(d / "wordnet" / "anchors.tsv")
    rows = read_tsv(d / "wordnet" / "eval_pairs.tsv")
    ctx = encode_texts(lm, AutoTokenizer.from_pretrained(d / "base"), [a["gloss"] for a in anchors], 4, 16)
    probe, _ = relational_alignment(ctx, np.array([[int(r["i"]), int(r["j"])] for r in rows]),
                                    np.array([float(r["path_similarity"]) for r in rows]), [0, 1])
    assert report["pearson_before"] == probe["pearson"]["mean"] and report["spearman_before"] == probe["spearman"]["mean"]
    lemmas = encode_texts(lm, AutoTokenizer.from_pretrained(d / "base"), [" " + a["lemma"] for a in anchors], 4, 16)
    lemma, _ = relational_alignment(lemmas, np.array([[int(r["i"]), int(r["j"])] for r in rows]),
                                    np.array([float(r["path_similarity"]) for r in rows]), [0, 1])
    assert report["before"]["lemma"]["spearman"] == lemma["spearman"]
    # after: the saved modulator through the block-by-block reference
    mod, config = load_modulator(tmp_path / "out" / "modulator.safetensors")
    alphas = mod.alphas().tolist()
    assert mod.layers == [1, 2] and report["alpha_per_layer"] == pytest.approx({"l1": alphas[0], "l2": alphas[1]})
    assert all(abs(a - 0.01) > 1e-4 for a in alphas)  # α moved (lr 0.5 on the logit)
    assert report["val_nll_after"] == pytest.approx(val_nll_by_hand(lm, d, dict(zip([1, 2], alphas))), rel=1e-6)
    assert report["pearson_after"] != report["pearson_before"]
    # table and projection were frozen; the geometric scale is the anchors' mean PCA-coordinate norm
    init = load_file(str(d / "init.safetensors"))
    assert torch.equal(mod.table, init["geo_table"]) and torch.equal(mod.projection, init["projection"])
    pcs = (ctx.astype(np.float64) - init["pca_mean"].double().numpy()) @ init["pca_components"].double().numpy().T
    assert config["geo_scale"] == pytest.approx(float(np.linalg.norm(pcs, axis=1).mean()), rel=1e-9)
    # α per layer over training: step 0 and every logged step, one series per layer
    assert [r["step"] for r in alpha_rows if r["series"] == "layer 2"] == [0, 1, 2, 3]
    assert [r["step"] for r in result.eval_curve] == [0, 2, 3]
    assert not list((tmp_path / "ckpt").glob("*/checkpoint.pt"))  # removed after success
    # the NLL change's interval: the per-position NLLs behind both means, paired on the same windows; two
    # identical seeds leave only the windows' component, centred on the change in %
    tokens = report["token_nll"]
    assert float(tokens["before"].astype(np.float64).mean()) == pytest.approx(report["val_nll_before"], rel=1e-9)
    assert float(tokens["after"].astype(np.float64).mean()) == pytest.approx(report["val_nll_after"], rel=1e-9)
    twin = {"token_nll": {k: np.copy(v) for k, v in tokens.items()}}
    nll_claim([report, twin])
    low, high = report["val_nll_change_pct_ci_low"], report["val_nll_change_pct_ci_high"]
    assert low < report["val_nll_change_pct"] < high
    assert (low + high) / 2 == pytest.approx(report["val_nll_change_pct"], rel=1e-9)
    json.dumps(report)  # the report is plain JSON once the per-position NLLs are popped


def test_a_fixed_alpha_trains_nothing_and_is_measured(tiny, stage_inputs, tmp_path):
    lm, _, _, _ = tiny
    d = stage_inputs
    report, result, alpha_rows = build_modulator(stage_config(alpha_mode="fixed", alpha_init=0.29154), ALIGN,
                                                 d / "base", d / "tokens", d / "wordnet", None, d / "init.safetensors",
                                                 tmp_path / "out", None)
    mod, _ = load_modulator(tmp_path / "out" / "modulator.safetensors")
    assert result is None and report["trained"] is False and report["alpha_mean"] == pytest.approx(0.29154)
    assert torch.allclose(mod.alphas(), torch.full((3,), 0.29154)) and not mod.alpha_logit.requires_grad
    assert report["val_nll_after"] == pytest.approx(val_nll_by_hand(lm, d, {0: 0.29154, 1: 0.29154, 2: 0.29154}),
                                                    rel=1e-6)
    assert len(alpha_rows) == 3


def test_layers_past_the_model_are_refused_before_any_work(stage_inputs, tmp_path):
    d = stage_inputs
    with pytest.raises(ModulatorError, match=r"modulator.layers lists \[5\] but the base model has 3 layers"):
        build_modulator(stage_config(layers=[1, 5]), ALIGN, d / "base", d / "tokens", d / "wordnet", None,
                        d / "init.safetensors", tmp_path / "out", None)
    assert not (tmp_path / "out").exists()


FIELD = {"experts": [1, 2], "edim": 4, "deform_scale": 0.5, "null_fraction": 0.25, "alpha_min": 0.0}


def test_the_field_stage_trains_its_experts_and_saves_a_modulator_that_loads_back(tiny, stage_inputs, tmp_path):
    from lookahead.pipeline.modulator.field import FieldModulator

    lm, _, _, _ = tiny
    d = stage_inputs
    cfg = stage_config(kind="field", layers=[0, 2], field=FIELD)
    report, result, alpha_rows = build_modulator(cfg, ALIGN, d / "base", d / "tokens", d / "wordnet", None,
                                                 d / "init.safetensors", tmp_path / "out", None)
    mod, config = load_modulator(tmp_path / "out" / "modulator.safetensors")
    assert isinstance(mod, FieldModulator) and mod.layers == [0, 2] and config["modulator"]["kind"] == "field"
    # the val NLL after is the saved modulator's, through the stock model with its hooks
    stream = torch.from_numpy(np.load(d / "tokens" / "val.npy").astype(np.int64))
    windows = torch.stack([stream[s : s + 33] for s in range(0, 6 * 32, 32)])
    with torch.no_grad():
        logits = mod(lm, windows[:, :-1]).logits
    assert report["val_nll_after"] == pytest.approx(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item(),
                                                    rel=1e-6)
    assert report["val_nll_after"] != report["val_nll_before"]
    alphas = mod.alphas()
    assert report["alpha_per_layer"] == pytest.approx({"l0_k1": alphas[0, 0].item(), "l0_k2": alphas[0, 1].item(),
                                                        "l2_k1": alphas[1, 0].item(), "l2_k2": alphas[1, 1].item()})
    assert (alphas - 0.01).abs().min() > 1e-4  # α moved
    assert report["kind"] == "field" and report["validity_mean"] == 1.0 and set(report["validity"]) == set(
        report["alpha_per_layer"])
    assert report["active_dims"] == 12 and set(report["health"]) == {"k1", "k2"}
    assert report["cv_in_band"] == (0.16 <= report["after"]["pentachoron"]["pentachoron_cv"]["mean"] <= 0.26)
    assert {"token", "lemma"} <= set(report["before"]) and {"token", "lemma"} <= set(report["after"])
    # α per layer per expert over training, and the CV monitor beside the val NLL
    assert [r["step"] for r in alpha_rows if r["series"] == "layer 2, k=2"] == [0, 1, 2, 3]
    assert all("pentachoron_cv" in r for r in result.eval_curve[1:]) and "validity_k1" in result.train_curve[0]


def test_the_field_modulators_optimiser_groups_and_cv_early_stop(tiny, stage_inputs):
    from lookahead.pipeline.modulator.build import ModulatorModule
    from lookahead.pipeline.modulator.field import build_field

    lm, _, _, _ = tiny
    cfg = stage_config(kind="field", field={**FIELD, "cv_patience": 2, "geometric_lr_scale": 0.1, "alpha_lr_scale": 0.5})
    field = build_field(cfg, 16, [0, 1])
    module = ModulatorModule(field, lm, np.zeros(100, np.uint16), torch.zeros(2, 33, dtype=torch.long), cfg)
    scales = {name: module.lr_scale(name) for name, _ in field.named_parameters()}
    assert scales["alpha_logit"] == 0.5 and scales["experts.0.gate.weight"] == 1.0
    assert scales["experts.1.deform.weight"] == 0.1 and scales["experts.1.norm.bias"] == 0.1
    curve = [{"pentachoron_cv": cv} for cv in (0.45, 0.40)]
    assert module.stop_reason(curve) is None  # never inside the band: it cannot leave it
    curve = [{"pentachoron_cv": cv} for cv in (0.2, 0.3)]
    assert module.stop_reason(curve) is None  # out for one evaluation only
    curve.append({"pentachoron_cv": 0.1})
    assert module.stop_reason(curve) == "pentachoron CV 0.100 outside [0.16, 0.26] for 2 evaluations"
    assert ModulatorModule(field, lm, np.zeros(100, np.uint16), torch.zeros(2, 33, dtype=torch.long),
                           stage_config(kind="field", field=FIELD)).stop_reason(curve) is None  # patience 0: off


def test_an_interrupted_field_training_resumes_to_the_same_weights(tiny, stage_inputs, tmp_path):
    from lookahead.pipeline.modulator.build import ModulatorModule
    from lookahead.pipeline.modulator.field import build_field
    from lookahead.train.loop import train

    lm, _, _, _ = tiny
    cfg = stage_config(kind="field", field=FIELD)
    stream = np.load(stage_inputs / "tokens" / "train.npy")
    val = torch.from_numpy(np.load(stage_inputs / "tokens" / "val.npy")[:66].astype(np.int64)).view(2, 33)

    def module(interrupt: bool = False):
        torch.manual_seed(cfg.train.seed)
        m = ModulatorModule(build_field(cfg, 16, [0, 1, 2]), lm, stream, val, cfg)
        if interrupt:
            batch = m.batch
            m.batch = lambda step: (_ for _ in ()).throw(KeyboardInterrupt()) if step == 2 else batch(step)
        return m

    straight = module()
    train(straight, cfg.train, stage="test", checkpoint_dir=tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        train(module(interrupt=True), cfg.train, stage="test", checkpoint_dir=tmp_path / "b")
    resumed = module()
    assert train(resumed, cfg.train, stage="test", checkpoint_dir=tmp_path / "b").resumed_from == 2
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_modulator_scores_the_test_windows_and_draws_its_curve_on_selection(phase_inputs):
    from lookahead.artifacts.contexts import ContextCache
    from lookahead.artifacts.val_scores import ScoringConfig, WindowsConfig, scoring_windows
    from lookahead.pipeline.modulator.build import modulator_windows
    from lookahead.pipeline.modulator.config import ModulatorConfig, ModulatorError

    i, roles = phase_inputs, WindowsConfig(per_role=4)
    cache = ContextCache(i["contexts"])
    windows = modulator_windows(ModulatorConfig(eval_tokens=24), roles, i["tokens"], i["contexts"])
    scoring = ScoringConfig(roles=roles)
    assert torch.equal(windows["test"], scoring_windows(i["tokens"], scoring, 12, "test", cache))
    assert torch.equal(windows["curve"], scoring_windows(i["tokens"], scoring, 12, "selection")[:2])  # 24 tokens
    with pytest.raises(ModulatorError, match="seq_len is 8, but the test windows hold 12 tokens"):
        modulator_windows(ModulatorConfig(seq_len=8), roles, i["tokens"], i["contexts"])
