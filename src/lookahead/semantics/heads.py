"""Per-head probes of a causal LM with ``o_proj`` attention outputs (OLMo2, Llama-style models).

The input of each layer's ``o_proj`` is the concatenation of the heads' outputs (B, T, H·dh). A
forward pre-hook there reads each head's slice and multiplies it by a per-head mask, which gives:

- output norm: E‖W_O[h] z_h‖ over tokens (the head's write into the residual stream);
- importance (Michel et al. 2019): E|∂L/∂mask_h| at mask = 1;
- ablation: NLL(mask_h = 0) − NLL(dense), one head at a time;
- affinity: Pearson correlation across tokens of the heads' output norms, (L·H, L·H).

An ablation of a head of layer l changes nothing below l: the layers under it are not run again but
replay the outputs a dense pass of the same windows recorded (:func:`replayed`), the same floats the
full forward computes there, so about half the layers' work of the L·H ablations is saved.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from lookahead.lm.nll import causal_lm_nll


def attention_layers(model) -> list:
    """The attention modules (each with ``o_proj``) of a decoder, in layer order."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer.self_attn, "o_proj") for layer in layers):
        raise TypeError(f"{type(model).__name__}: head probes need decoder layers with self_attn.o_proj")
    return [layer.self_attn for layer in layers]


class HeadMasks(contextlib.AbstractContextManager):
    """Hooks every ``o_proj``: scales head slices by ``mask`` (L, H) and records per-head outputs.
    A mask over key/value groups (L, G) scales each group's query heads alike (its gradient is the
    group's: the sum over its heads).

    After a forward pass, ``norms`` is a list over layers of (B, T, H) output norms.
    """

    def __init__(self, model, n_heads: int, mask: torch.Tensor, record: bool = True):
        self.attn = attention_layers(model)
        self.n_heads = n_heads
        self.mask = mask
        self.record = record  # False: scale only (the norms cost about what o_proj does)
        self.norms: list[torch.Tensor] = []
        self.handles = []

    def __enter__(self):
        for layer, attn in enumerate(self.attn):
            self.handles.append(attn.o_proj.register_forward_pre_hook(self._hook(layer)))
        return self

    def _hook(self, layer: int):
        def hook(module, args):
            (z,) = args  # (B, T, H*dh)
            b, t, width = z.shape
            heads = z.view(b, t, self.n_heads, width // self.n_heads)  # (B, T, H, dh)
            mask = self.mask[layer]
            if mask.shape[-1] != self.n_heads:  # one entry per key/value group
                mask = mask.repeat_interleave(self.n_heads // mask.shape[-1], -1)
            heads = heads * mask.view(1, 1, -1, 1).to(heads.dtype)
            if not self.record:
                return (heads.reshape(b, t, width),)
            w = module.weight.view(module.weight.shape[0], self.n_heads, -1)  # (d, H, dh)
            with torch.no_grad():
                out = torch.einsum("bthk,dhk->bthd", heads.detach(), w.detach())  # (B, T, H, d)
                self.norms.append(out.norm(dim=-1))
            return (heads.reshape(b, t, width),)

        return hook

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False


class _Replay(torch.nn.Module):
    """A decoder layer's recorded output, returned in place of running the layer."""

    def __init__(self, output: torch.Tensor):
        super().__init__()
        self.output = output

    def forward(self, hidden_states, *args, **kwargs):
        return self.output


def layer_outputs(model, windows: torch.Tensor, n_heads: int) -> list[torch.Tensor]:
    """Each decoder layer's output on ``windows`` (B, T+1) in a dense pass under :class:`HeadMasks` of
    ones: what every layer below an ablated head computes in the ablation's forward."""
    layers = getattr(model, "model", model).layers
    outputs: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _a, out: outputs.append(out)) for layer in layers]
    try:
        ones = torch.ones(len(layers), n_heads, device=windows.device)
        with torch.no_grad(), HeadMasks(model, n_heads, ones, record=False):
            model(input_ids=windows[:, :-1])
    finally:
        for handle in handles:
            handle.remove()
    return outputs


@contextlib.contextmanager
def replayed(model, outputs: list[torch.Tensor], below: int):
    """The model's layers under ``below`` replaced, for the context, by their recorded ``outputs``."""
    layers = getattr(model, "model", model).layers
    kept = [layers[i] for i in range(below)]
    try:
        for i in range(below):
            layers[i] = _Replay(outputs[i])
        yield model
    finally:
        for i, layer in enumerate(kept):
            layers[i] = layer


def probe_heads(model, batches: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """Head statistics of ``model`` over ``batches`` of token windows (B, T+1).

    Returns arrays: ``output_norm``, ``importance``, ``ablation_dnll`` (L, H); ``affinity``
    (L·H, L·H); and ``dense_nll`` (scalar array).
    """
    n_layers = len(attention_layers(model))
    n_heads = model.config.num_attention_heads
    model.eval()
    device = next(model.parameters()).device
    batches = [w.to(device) for w in batches]
    norms, grads, dense = [], torch.zeros(n_layers, n_heads), []
    for windows in batches:
        mask = torch.ones(n_layers, n_heads, requires_grad=True, device=device)
        with HeadMasks(model, n_heads, mask) as hooks:
            loss = causal_lm_nll(model, windows)
        (grad,) = torch.autograd.grad(loss, mask)
        grads += grad.abs().cpu()
        dense.append(loss.item())
        norms.append(torch.stack(hooks.norms, dim=2).flatten(0, 1).float().cpu())  # (B*T, L, H)
    norms_all = torch.cat(norms).flatten(1)  # (tokens, L*H)
    ablation = torch.zeros(n_layers, n_heads)
    recorded = [layer_outputs(model, w, n_heads) for w in batches]
    with torch.no_grad():
        for layer in range(n_layers):
            for head in range(n_heads):
                mask = torch.ones(n_layers, n_heads, device=device)
                mask[layer, head] = 0.0
                ablated = []
                with HeadMasks(model, n_heads, mask, record=False):
                    for w, outputs in zip(batches, recorded):
                        with replayed(model, outputs, layer):
                            ablated.append(causal_lm_nll(model, w).item())
                ablation[layer, head] = float(np.mean(ablated) - np.mean(dense))
    with np.errstate(invalid="ignore", divide="ignore"):
        affinity = np.corrcoef(norms_all.T.double().numpy())
    affinity = np.nan_to_num(affinity, nan=0.0)  # a head with constant output norm correlates with nothing
    return {
        "output_norm": norms_all.mean(0).view(n_layers, n_heads).numpy(),
        "importance": (grads / len(batches)).numpy(),
        "ablation_dnll": ablation.numpy(),
        "affinity": affinity.astype(np.float32),
        "dense_nll": np.array(np.mean(dense)),
    }
