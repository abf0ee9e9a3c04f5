"""Head probes and the probe stage's measures on constructed models with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Olmo2Config, Olmo2ForCausalLM

from lookahead.pipeline.probe.build import ProbeConfig, embedding_geometry, load_model, weight_geometry
from lookahead.semantics.alignment import relational_alignment
from lookahead.semantics.heads import HeadMasks, probe_heads


@pytest.fixture
def tiny_lm(seed):
    cfg = Olmo2Config(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=16, pad_token_id=0, eos_token_id=0)
    return Olmo2ForCausalLM(cfg).eval()


def test_masks_of_one_change_nothing(tiny_lm):
    w = torch.randint(0, 60, (2, 10))
    with torch.no_grad():
        ref = tiny_lm(w).logits
        with HeadMasks(tiny_lm, 4, torch.ones(2, 4)):
            out = tiny_lm(w).logits
    assert torch.equal(ref, out)


def test_a_head_with_zero_output_is_unimportant_and_ablating_it_changes_nothing(tiny_lm):
    with torch.no_grad():  # head 2 of layer 1 writes nothing: its W_O columns are zero
        tiny_lm.model.layers[1].self_attn.o_proj.weight.view(32, 4, 8)[:, 2, :] = 0.0
    batches = [torch.randint(0, 60, (3, 11)) for _ in range(2)]
    stats = probe_heads(tiny_lm, batches)
    assert stats["importance"][1, 2] == 0.0
    assert stats["ablation_dnll"][1, 2] == pytest.approx(0.0, abs=1e-6)
    assert stats["output_norm"][1, 2] == 0.0
    assert (stats["importance"][0] > 0).all() and (np.abs(stats["ablation_dnll"][0]) > 1e-6).all()
    assert stats["affinity"].shape == (8, 8)
    live = [i for i in range(8) if i != 6]
    assert np.allclose(np.diag(stats["affinity"])[live], 1.0)
    assert np.allclose(stats["affinity"], stats["affinity"].T)


def test_ablation_equals_a_forward_pass_with_the_head_zeroed(tiny_lm):
    batches = [torch.randint(0, 60, (2, 9))]
    stats = probe_heads(tiny_lm, batches)
    import torch.nn.functional as F

    def nll(model):
        with torch.no_grad():
            logits = model(batches[0][:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), batches[0][:, 1:].flatten()).item()

    dense = nll(tiny_lm)
    with torch.no_grad():
        tiny_lm.model.layers[0].self_attn.o_proj.weight.view(32, 4, 8)[:, 1, :] = 0.0
    assert stats["ablation_dnll"][0, 1] == pytest.approx(nll(tiny_lm) - dense, abs=1e-5)


@pytest.mark.parametrize("family", ["olmo2", "grouped llama"])
def test_ablations_replaying_the_layers_below_are_the_full_forwards_floats(family, tiny_lm):
    """probe_heads replays the dense pass's outputs of the layers under an ablated head: the same
    floats, bit for bit, as the plain reference that runs every layer with the head zeroed."""
    from tests.test_families import tiny_llama

    from lookahead.lm.nll import causal_lm_nll

    model = tiny_lm if family == "olmo2" else tiny_llama(n_layers=3, n_heads=6, kv_heads=2, hidden=48).eval()
    n_layers, n_heads = len(model.model.layers), model.config.num_attention_heads
    batches = [torch.randint(0, 60, (3, 11)) for _ in range(2)]
    stats = probe_heads(model, batches)
    with torch.no_grad():
        dense = [causal_lm_nll(model, w).item() for w in batches]
        for layer in range(n_layers):
            for head in range(n_heads):
                mask = torch.ones(n_layers, n_heads)
                mask[layer, head] = 0.0
                with HeadMasks(model, n_heads, mask):
                    ablated = [causal_lm_nll(model, w).item() for w in batches]
                assert stats["ablation_dnll"][layer, head] == np.float32(np.mean(ablated) - np.mean(dense)), (layer, head)
    assert isinstance(model.model.layers[0], type(model.model.layers[-1]))  # every layer put back


def test_relational_alignment_of_vectors_built_from_the_similarity():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 8))
    pairs = np.array([(i, j) for i in range(40) for j in range(i + 1, 40)])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = np.einsum("nd,nd->n", unit[pairs[:, 0]], unit[pairs[:, 1]])
    sim = (cos + 1) / 2  # a monotone function of the cosine: Spearman = 1
    out, bands = relational_alignment(vectors, pairs, sim, seeds=[0, 1, 2])
    assert out["spearman"]["mean"] == pytest.approx(1.0) and out["pearson"]["mean"] == pytest.approx(1.0)
    assert sum(b["n"] for b in bands) == len(pairs)


def test_packaged_minilm_is_a_trained_network_not_a_gaussian():
    name, model, tokenizer, causal = load_model("minilm", base_dir="unused")
    assert not causal and model.config.hidden_size == 384
    cfg = ProbeConfig(seeds=[0, 1, 2], cosine_pairs=2000, pentachora=200)
    emb, spectrum = embedding_geometry(model.get_input_embeddings().weight.detach().numpy(), cfg)
    assert emb["cv_ratio"]["mean"] > 2.0  # simplex volumes far more varied than in a Gaussian cloud
    assert emb["pr_over_dim"] < 0.8
    gauss, _ = embedding_geometry(np.random.default_rng(0).normal(size=(5000, 384)), cfg)
    assert gauss["pr_over_dim"] > 0.9 and abs(gauss["cv_ratio"]["mean"] - 1) < 0.3
    weights = weight_geometry(model)
    assert len(weights["qk"]["qk_symmetry_deviation"]) == 6
    assert len(weights["attention.self.query"]["stable_rank"]) == 6


def test_a_model_directory_is_probed_as_a_causal_lm(tmp_path, tiny_lm, tiny_tokenizer):
    tiny_lm.save_pretrained(tmp_path / "lm")
    tiny_tokenizer.save_pretrained(tmp_path / "lm")
    name, model, tokenizer, causal = load_model(str(tmp_path / "lm"), base_dir="unused")
    assert causal and name == str(tmp_path / "lm")
    for (key, a), (_, b) in zip(tiny_lm.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), key


def test_token_encodings_are_the_lemmas_own_states_after_its_gloss(tiny_tokenizer):
    from lookahead.semantics.alignment import token_encodings

    torch.manual_seed(0)
    cfg = Olmo2Config(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0,
                      eos_token_id=0)
    lm = Olmo2ForCausalLM(cfg).eval()
    assert tiny_tokenizer.pad_token is not None  # batches of texts of different lengths are padded
    anchors = [{"lemma": "alpha", "gloss": "beta gamma delta"}, {"lemma": "kappa iota", "gloss": "zeta eta theta."},
               {"lemma": "beta", "gloss": " ".join(["gamma epsilon"] * 30)}]
    got = token_encodings(lm, tiny_tokenizer, anchors, batch_size=2, max_tokens=12)
    for a, row in zip(anchors[:2], got):  # the stock forward of "gloss. lemma", one text at a time
        ids = tiny_tokenizer(a["gloss"].rstrip(".") + ". " + a["lemma"], add_special_tokens=False)["input_ids"]
        n_lemma = len(tiny_tokenizer(" " + a["lemma"], add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            hidden = lm(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
        assert np.allclose(row, hidden[-n_lemma:].mean(0).numpy(), atol=1e-5)
    # a long gloss is cut so that gloss and lemma fit max_tokens: the state of " beta" after 11 gloss tokens
    gloss = tiny_tokenizer(" ".join(["gamma epsilon"] * 30) + ".", add_special_tokens=False)["input_ids"]
    ids = gloss[:11] + tiny_tokenizer(" beta", add_special_tokens=False)["input_ids"]
    assert len(ids) == 12
    with torch.no_grad():
        hidden = lm(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    assert np.allclose(got[2], hidden[-1].numpy(), atol=1e-5)


def test_the_score_form_of_a_grouped_model_sums_each_query_heads_own():
    """Under grouped-query attention W_K has fewer rows than W_Q: the layer's score form is the sum over
    query heads h of W_Q[h]^T W_K[h // group], written out here head by head."""
    from lookahead.pipeline.probe.build import keys_per_query_head
    from tests.test_families import tiny_llama

    model = tiny_llama(n_heads=6, kv_heads=2, hidden=48)  # head_dim 8, 3 query heads per group
    attn = model.model.layers[0].self_attn
    wq, wk = attn.q_proj.weight.detach().numpy(), attn.k_proj.weight.detach().numpy()
    want = sum(wq[8 * h : 8 * h + 8].T.astype(np.float64) @ wk[8 * (h // 3) : 8 * (h // 3) + 8] for h in range(6))
    np.testing.assert_allclose(wq.T.astype(np.float64) @ keys_per_query_head(wq, wk, model), want, atol=1e-6)
    assert keys_per_query_head(wq, wq, model) is wq  # one key head per query head: as it is
    qk = weight_geometry(model)["qk"]
    assert len(qk["qk_pos_eig_share"]) == 2 and all(0 <= v <= 1 for v in qk["qk_pos_eig_share"])
