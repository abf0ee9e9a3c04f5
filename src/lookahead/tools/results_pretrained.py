"""The results page's section on the pretrained LM (``make smollm2-run``; docs/research/pretrained-lm.md):
its claims where collected (``metrics/smollm2/headline.json`` and ``report.json``), its dense NLL in nats
and bits per byte, and the run's progress (``metrics/smollm2/run.json``) until then."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lookahead.core.report import read_headline
from lookahead.tools.verdicts import interval_cell, scored_on, table

PRETRAINED = Path("metrics/smollm2")
NAME = "SmolLM2-135M"


def bits_per_byte(nll: float, bytes_per_token: float) -> float:
    """A per-token NLL in nats as bits per byte of text (the level tokenizers can be compared on)."""
    return nll / math.log(2) / bytes_per_token


def _hours(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 3600:.2f}"


def pretrained_section(root: Path) -> list[str]:
    """Nothing before the run has started (its ``run.json``)."""
    d = root / PRETRAINED
    if not (d / "run.json").is_file():
        return []
    run = json.loads((d / "run.json").read_text(encoding="utf-8"))
    out = [f"## On a pretrained LM ({NAME})", "",
           f"`{PRETRAINED}/`, written by `make smollm2-run` ([pretrained LM](research/pretrained-lm.md)): every stage "
           f"on {NAME}-Instruct (Llama, 30 layers × 9 query heads sharing 3 key/value heads), its Q4_1 GGUF "
           "dequantized to fp32 — the same weights in every arm. One pretrained LM: every interval is over its "
           "seeds and test windows.", ""]
    if (d / "base.json").is_file() and (d / "tokenizer.json").is_file():
        base, tok = read_headline(d / "base.json"), read_headline(d / "tokenizer.json")
        out += [f"Dense val NLL {base['val_nll']:.3f} nats a token, "
                f"{bits_per_byte(base['val_nll'], tok['val_bytes_per_token']):.3f} bits a byte of gloss text "
                f"(`{PRETRAINED}/base.json`; {tok['val_bytes_per_token']:.2f} bytes a token).", ""]
    if (d / "headline.json").is_file() and (d / "report.json").is_file():
        report = json.loads((d / "report.json").read_text(encoding="utf-8"))
        rows = []
        for name, row in report["claims"].items():
            c = row["per_base"]["0"]
            rows.append((f"`{name}`", row["claimed"], interval_cell(c["mean"], c["ci_low"], c["ci_high"]), c["verdict"]))
        out += [scored_on(report.get("window_set")), ""]
        out += table(("claim", "claimed", f"{NAME} (95 % interval)", "verdict"), rows) + [""]
    stages = run["stages"]
    done = [s for s, e in stages.items() if e.get("done")]
    out += [f"The run: {len(done)} stages done, {_hours(sum(e['seconds'] or 0 for e in stages.values()))} h on "
            "2 cores so far (each stage's seconds, summed over the sessions that ran it):", ""]
    out += table(("stage", "hours", "state"),
                 [(f"`{s}`", _hours(e.get("seconds")), "done" if e.get("done") else "started") for s, e in stages.items()])
    return out + [""]
