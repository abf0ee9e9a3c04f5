"""Token ids of many texts at once: one helper for every stage that encodes text without a model
(the tokenizer stage's streams, WordNet's lemma matching, the probe's static text embeddings)."""

from __future__ import annotations


def encode_each(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's token ids without special tokens: ``tokenizer(texts, add_special_tokens=False)``'s
    ``input_ids``. A fast tokenizer whose backend neither truncates nor pads encodes them in its Rust
    backend's one batch call, as its own call does, without turning each encoding into Python lists
    and dicts first: for WordNet's 147k lemmas, 1.6 s of CPU against the call's 3.1 s."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is None or backend.truncation is not None or backend.padding is not None
            or backend.encode_special_tokens != getattr(tokenizer, "split_special_tokens", False)):
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]
