"""Where an existing model comes from: a hub id or a local directory (``base.source``).

Kept apart from :mod:`lookahead.pipeline.base` so that the tokenizer stage, which reads only these keys,
does not depend on the pretraining code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from lookahead.core.errors import ConfigError, require


@dataclasses.dataclass
class ModelSource:
    """The `base` keys that say where the model (and its tokenizer) come from."""

    source: Literal["scratch", "path", "hub"] = "scratch"
    """`scratch` = pretrain OLMo2 here; `path` = copy a local HF model dir; `hub` = an HF id."""
    model: str | None = None
    """HF model id (`hub`) or directory (`path`); null for `scratch`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) for `hub`."""
    trust_remote_code: bool = False
    """Allow the model repo's own code (off unless you trust it)."""

    def __post_init__(self) -> None:
        if self.source == "scratch":
            require(self.model is None, "model", "must be null when source is 'scratch'")
        else:
            what = "directory" if self.source == "path" else "hub id"
            require(bool(self.model), "model", f"must name a {what} when source is {self.source!r}")
        require(self.source == "hub" or self.revision is None, "revision", "only applies when source is 'hub'")

    def check_path(self) -> None:
        if self.source == "path" and not Path(self.model).is_dir():
            raise ConfigError("base.model", f"directory {self.model} not found")

    def load_tokenizer(self):
        """The model's own tokenizer (``source`` must be ``path`` or ``hub``)."""
        from transformers import AutoTokenizer

        self.check_path()
        tok = AutoTokenizer.from_pretrained(self.model, revision=self.revision, trust_remote_code=self.trust_remote_code)
        if tok.eos_token_id is None:
            raise ValueError(f"tokenizer of {self.model} has no EOS token: documents could not be separated")
        return tok

    def load_model(self):
        """The causal LM of ``model``, in fp32 (``source`` must be ``path`` or ``hub``)."""
        import torch
        from transformers import AutoModelForCausalLM

        self.check_path()
        return AutoModelForCausalLM.from_pretrained(
            self.model, revision=self.revision, trust_remote_code=self.trust_remote_code, dtype=torch.float32
        )
