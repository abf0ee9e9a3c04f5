"""The architecture of a scratch OLMo2 model (the embedded default) and its Hugging Face config."""

from __future__ import annotations

import dataclasses

from lookahead.core.errors import require
from lookahead.lm.families.base import head_dim_of

__all__ = ["ArchConfig", "head_dim_of", "olmo2_config"]


@dataclasses.dataclass
class ArchConfig:
    """Shape of a scratch OLMo2 model (``transformers.Olmo2Config``)."""

    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads per block (must divide hidden_size unless head_dim is set)."""
    head_dim: int | None = None
    """Width of each head's query, key and value (even, for RoPE); None: hidden_size / n_heads. Set,
    the attention is n_heads * head_dim wide whatever the residual stream's width (a narrower
    attention: the smaller dense models of docs/research/frontier.md)."""
    hidden_size: int = 128
    """Residual stream width."""
    intermediate_size: int = 512
    """SwiGLU MLP width."""
    context_length: int = 128
    """Training sequence length, also max_position_embeddings."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rms_norm_eps: float = 1.0e-6
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool = False
    """Share the input embedding and the LM head (OLMo-2 does not)."""
    init_std: float = 0.02
    """Std of the normal initialisation of weight matrices."""

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "hidden_size", "intermediate_size", "context_length"):
            require(getattr(self, name) >= 1, name, f"must be >= 1; got {getattr(self, name)}")
        if self.head_dim is None:
            require(
                self.hidden_size % self.n_heads == 0,
                "n_heads",
                f"must divide hidden_size ({self.hidden_size}) unless head_dim is set; got {self.n_heads}",
            )
            require((self.hidden_size // self.n_heads) % 2 == 0, "hidden_size",
                    f"hidden_size / n_heads must be even for RoPE; got {self.hidden_size}/{self.n_heads}")
        else:
            require(self.head_dim >= 2 and self.head_dim % 2 == 0, "head_dim",
                    f"must be an even number >= 2 (RoPE rotates pairs) or null; got {self.head_dim}")
        require(self.rope_theta > 0, "rope_theta", f"must be > 0; got {self.rope_theta}")
        require(self.rms_norm_eps > 0, "rms_norm_eps", f"must be > 0; got {self.rms_norm_eps}")
        require(self.init_std > 0, "init_std", f"must be > 0; got {self.init_std}")


def olmo2_config(arch: ArchConfig, tokenizer):
    """The ``Olmo2Config`` of a scratch model for ``tokenizer``."""
    from transformers import Olmo2Config

    # head_dim only where set: a config that does not name it (OLMo2's own) reads hidden_size / n_heads,
    # and the default model's config.json stays what it was
    width = {} if arch.head_dim is None else {"head_dim": arch.head_dim}
    return Olmo2Config(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.n_layers,
        num_attention_heads=arch.n_heads,
        num_key_value_heads=arch.n_heads,
        max_position_embeddings=arch.context_length,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        rms_norm_eps=arch.rms_norm_eps,
        initializer_range=arch.init_std,
        tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **width,
    )
