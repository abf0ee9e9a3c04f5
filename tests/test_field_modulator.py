"""The geometric field modulator's model (lookahead.pipeline.modulator.field) against closed forms,
an independent determinant, the stock HF forward and a reference written out per block."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lookahead.pipeline.modulator.field import FieldModulator, cayley_menger_volume2, regular_simplex
from tests.test_runtime import tiny_olmo2


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_cayley_menger_volume_of_a_regular_simplex_is_the_closed_form(k):
    edge = 1.7
    points = regular_simplex(k, 8, torch.float64) * edge
    closed = (edge**k / math.factorial(k)) ** 2 * (k + 1) / 2**k  # V = a^k / k! · sqrt((k+1) / 2^k)
    assert cayley_menger_volume2(points).item() == pytest.approx(closed, rel=1e-10)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_cayley_menger_volume_of_random_simplices_is_the_gram_determinant(k):
    points = torch.randn(16, k + 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    edges = points[:, 1:] - points[:, :1]  # (16, k, 8) from vertex 0
    gram = torch.linalg.det(edges @ edges.transpose(1, 2)) / math.factorial(k) ** 2  # an independent formula
    assert torch.allclose(cayley_menger_volume2(points), gram, rtol=1e-9, atol=1e-12)


def test_parameter_count_is_the_notebooks_at_its_defaults():
    # section 12: 38,552 parameters at d = 512, 6 layers (experts shared by the layers, α per layer per expert)
    modulator = FieldModulator(512, list(range(6)))
    assert sum(p.numel() for p in modulator.parameters()) == 38_552
    assert len(modulator.active) == 384


def test_alpha_zero_gives_the_stock_logits_exactly():
    lm = tiny_olmo2(n_layers=3, hidden=32).eval()
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    modulator = FieldModulator(32, [0, 1, 2], alpha_init=0.0, alpha_min=0.0)
    with torch.no_grad():
        assert torch.equal(modulator(lm, ids).logits, lm(input_ids=ids).logits)


def block_inputs(lm, modulator: FieldModulator, ids: torch.Tensor) -> dict:
    """{(block, "in" | "seen"): the block's input before the modulator's hook and after it}."""
    captured = {}

    def capture(name, when):
        def pre(module, args, kwargs):
            captured[(name, when)] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return pre

    blocks = lm.model.layers
    with torch.no_grad():
        before = [b.register_forward_pre_hook(capture(i, "in"), with_kwargs=True, prepend=True)
                  for i, b in enumerate(blocks)]
        with modulator.attached(lm):
            after = [b.register_forward_pre_hook(capture(i, "seen"), with_kwargs=True) for i, b in enumerate(blocks)]
            lm(input_ids=ids)
        for handle in before + after:
            handle.remove()
    return captured


@pytest.mark.parametrize("null_mode", ["tail", "scatter"])
def test_null_space_dims_enter_each_block_untouched(null_mode):
    lm = tiny_olmo2(n_layers=2, hidden=32).eval()
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))
    modulator = FieldModulator(32, [0, 1], alpha_init=0.3, null_mode=null_mode)
    null = torch.ones(32, dtype=torch.bool)
    null[modulator.active] = False
    assert null.sum() == 8 and (null_mode == "tail") == bool(null[-8:].all())
    captured = block_inputs(lm, modulator, ids)
    for layer in (0, 1):
        seen, given = captured[(layer, "seen")], captured[(layer, "in")]
        assert torch.equal(seen[..., null], given[..., null])  # bit for bit
        assert not torch.equal(seen[..., ~null], given[..., ~null])  # the active dims did move


def reference_modulate(modulator: FieldModulator, h: torch.Tensor, layer: int) -> torch.Tensor:
    """The section-12 formula written out with plain loops and float64 (not the module's code)."""
    out = h.double().clone()
    active = modulator.active.tolist()
    x = out[..., active]
    factor = torch.ones_like(x)
    for e, expert in enumerate(modulator.experts):
        w, b = expert.deform.weight.double(), expert.deform.bias.double()
        verts = expert.template.double() + expert.deform_scale * (x @ w.T + b).unflatten(-1, (expert.k + 1, expert.edim))
        feats = []
        for i in range(expert.k + 1):
            for j in range(i + 1, expert.k + 1):
                feats.append((verts[..., i, :] - verts[..., j, :]).pow(2).sum(-1))
        edges = verts[..., 1:, :] - verts[..., :1, :]
        feats.append(torch.linalg.det(edges @ edges.transpose(-1, -2)) / math.factorial(expert.k) ** 2)
        f = torch.stack(feats, -1)
        f = F.layer_norm(f, (f.shape[-1],), expert.norm.weight.double(), expert.norm.bias.double(), expert.norm.eps)
        gate = torch.sigmoid(f @ expert.gate.weight.double().T + expert.gate.bias.double())
        alpha = min(max(torch.sigmoid(modulator.alpha_logit[layer, e].double()).item(), modulator.alpha_min),
                    modulator.alpha_max)
        factor = factor * ((1 - alpha) + alpha * gate)
    out[..., active] = x * factor
    return out


def test_each_block_receives_the_reference_modulation_of_its_input():
    lm = tiny_olmo2(n_layers=3, hidden=32).eval()
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(2))
    modulator = FieldModulator(32, [0, 2], alpha_init=0.3, deform_scale=0.5)
    captured = block_inputs(lm, modulator, ids)
    for k, layer in enumerate(modulator.layers):
        expected = reference_modulate(modulator, captured[(layer, "in")], k)
        assert torch.allclose(captured[(layer, "seen")].double(), expected, atol=1e-5)
    assert torch.equal(captured[(1, "seen")], captured[(1, "in")])  # an unmodulated block sees its input
    assert torch.equal(modulator.last_validity, torch.ones(2, 3))  # simplices of real points: V² > 0 everywhere


def test_validity_is_the_share_of_simplices_with_positive_volume():
    # undeformed templates are regular simplices (valid); a deformation that sends every vertex to
    # the origin leaves V² = 0 (the Cayley-Menger matrix of coincident points is singular): invalid
    lm = tiny_olmo2(n_layers=2, hidden=32).eval()
    ids = torch.randint(0, 61, (3, 9), generator=torch.Generator().manual_seed(4))
    modulator = FieldModulator(32, [0, 1], experts=(2, 4), null_fraction=0.0, deform_scale=1.0)
    collapsed = modulator.experts[1]
    with torch.no_grad():
        for expert in modulator.experts:
            expert.deform.weight.zero_()
            expert.deform.bias.zero_()
        collapsed.deform.bias.copy_(-collapsed.template.flatten())
    block_inputs(lm, modulator, ids)
    assert torch.equal(modulator.last_validity, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    assert modulator.monitor()["validity_k2"] == 1.0 and modulator.monitor()["validity_k4"] == 0.0
