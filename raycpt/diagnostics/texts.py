"""Prompt texts for ``raycpt compare``'s representation metrics: a JSONL of {text} / {prompt} / {s1, s2}, a .txt
(one prompt per line), the shipped WordNet glosses (``builtin:wordnet-glosses``), or a named prompt set of :mod:`raycpt.diagnostics.prompts`; tokenised
once with the base model's tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from raycpt.diagnostics import prompts as P
from raycpt.errors import RaycptError, read_user_text


def load_prompt_texts(spec: Optional[str], limit: int) -> list[str]:
    """Prompt texts from ``spec``: a JSONL of {text} or {s1, s2} or {prompt}, a .txt (one per line),
    ``builtin:wordnet-glosses``, or the trace prompt set name (when the prompts module knows it)."""
    if limit < 2:
        raise RaycptError(f"--max-prompts={limit}: need at least 2 prompts (dataset entropy compares samples)")
    if spec is None or spec == P.GLOSSES:
        return P.gloss_texts(limit)
    p = Path(spec).expanduser()
    if p.is_dir():
        raise RaycptError(f"--prompts {spec} is a directory; expected a .jsonl or .txt file")
    if not p.is_file():
        if spec in P.BUILTIN:  # a named prompt set of the trace module (builtin:wordnet-lexical)
            return [_record_text(r) for r in P.load_prompt_records(spec)][:limit]
        raise RaycptError(f"--prompts {spec}: file not found (expected a .jsonl of {{text}} or {{s1, s2}} records, "
                          "or a .txt with one prompt per line)")
    texts: list[str] = []
    if p.suffix == ".jsonl":
        for i, line in enumerate(read_user_text(p, "--prompts file").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise RaycptError(f"--prompts {p}: line {i} is not valid JSON") from None
            t = _record_text(rec)
            if not t:
                raise RaycptError(f"--prompts {p}: line {i} has none of the fields text, prompt, s1/s2")
            texts.append(t)
    else:
        texts = [ln.strip() for ln in read_user_text(p, "--prompts file").splitlines() if ln.strip()]
    texts = texts[:limit]
    if len(texts) < 2:
        raise RaycptError(f"--prompts {p}: found {len(texts)} prompt(s); need at least 2")
    return texts


def _record_text(rec: Any) -> str:
    if isinstance(rec, str):
        return rec
    if not isinstance(rec, dict):
        rec = dataclasses.asdict(rec) if dataclasses.is_dataclass(rec) else getattr(rec, "__dict__", {})
    if rec.get("text"):
        return str(rec["text"])
    if rec.get("prompt"):
        return str(rec["prompt"])
    if rec.get("s2") is not None:
        return f"{rec.get('s1') or ''}{rec['s2']}"
    return ""


def tokenize(tokenizer, texts: list[str], max_len: int) -> list[list[int]]:
    """Token ids per text (the tokenizer's own special tokens), cut to ``max_len``; empty ones dropped."""
    out = []
    for t in texts:
        ids = tokenizer(t, add_special_tokens=True)["input_ids"][:max_len]
        if len(ids) >= 3:
            out.append(list(ids))
    if len(out) < 2:
        raise RaycptError("fewer than 2 prompts left after tokenising (each needs >= 3 tokens)")
    return out
