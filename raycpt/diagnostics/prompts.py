"""Prompt records ``{s1, s2, group}`` -> token ids with context / query position sets.

A LayerTracer prompt is ``t = s1 ⊕ s2`` (the paper's section 3.1): ``s1`` holds the in-context
examples, ``s2`` the query, and the model's next token after ``s2`` is the answer. The text fed
to the model is exactly ``s1 + s2`` (nothing is inserted between them), tokenised once with the
tokenizer's own special tokens; character offsets then decide each token's side:

* **context** (``I_c``, zeroed by the sensitivity perturbation): tokens whose span lies inside s1;
* **query** (``I_q``): tokens whose span lies inside s2;
* **neither**: special tokens (BOS and the like) and zero-width tokens: never masked.

A token that straddles the boundary with real characters on both sides makes the split meaningless,
so it is an error naming the line, as are empty s1/s2, bad JSON and missing fields. Records may carry an optional ``answer``
(the expected continuation, used only to report how often the model's top-1 token starts it).

Prompt sources: ``builtin:wordnet-lexical`` (500 WordNet prompts shipped in ``raycpt/assets``)
or a path to a JSONL file (UTF-8, one JSON object per line; blank lines are skipped).

A token that begins with whitespace at the very end of s1 and runs on into s2 (``"...; "`` then
``"Query: ..."``: most tokenizers glue the space to the next word) is counted on the **s2** side:
the whitespace carries no context, and the prompt means what its author wrote. Only tokens that
straddle the seam with real (non-space) characters on the s1 side are refused.
:func:`encode_prompt` marks such prompts (``EncodedPrompt.seam_space``) so jobs report them once,
as a count.

Plain texts (no s1/s2 split) for ``raycpt compare`` and the drift probe come from
:func:`gloss_texts`: ``builtin:wordnet-glosses``, the same shipped asset the training corpus reads
(``raycpt/assets/wordnet_glosses.jsonl.gz``; no Debian package needed).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from raycpt.errors import RaycptError, json_record, read_user_text

BUILTIN = {"builtin:wordnet-lexical": "wordnet_lexical.jsonl"}
REQUIRED = ("s1", "s2", "group")
ASSETS = Path(__file__).resolve().parents[1] / "assets"
GLOSSES = "builtin:wordnet-glosses"
GLOSSES_FILE = ASSETS / "wordnet_glosses.jsonl.gz"
"""The shipped WordNet glosses: the training corpus's ``builtin:wordnet-glosses`` and compare's / drift's texts."""
_POS = re.compile(r"^[^:]*\((noun|verb|adjective|adverb)\):")


@dataclass
class PromptRecord:
    """One prompt as read from a file (``line`` is 1-based, for error messages)."""

    s1: str
    s2: str
    group: str
    answer: Optional[str] = None
    line: int = 0
    source: str = ""


@dataclass
class EncodedPrompt:
    """Token ids of ``s1 + s2`` with the positions of each side.

    ``context`` / ``query`` are sorted position lists; ``last`` is the position whose next-token
    distribution is traced (the last query token); ``answer_id`` is the first token of the
    expected answer when the record has one and it starts on a token boundary, else -1.
    """

    index: int
    group: str
    input_ids: list[int]
    context: list[int]
    query: list[int]
    last: int
    answer_id: int = -1
    line: int = 0
    extra: dict = field(default_factory=dict)
    seam_space: bool = False
    """s1 ends in whitespace that the tokenizer joined to s2's first token (counted on the s2 side)."""


def seam_note(prompts: Sequence[EncodedPrompt]) -> Optional[str]:
    """One line for the prompts whose trailing s1 whitespace went to s2's first token (None if none)."""
    n = sum(1 for p in prompts if p.seam_space)
    if not n:
        return None
    return (f"{n} of {len(prompts)} prompt(s): s1 ends in whitespace that the tokenizer joins to s2's first token; "
            "that token is counted on the s2 (query) side")


def builtin_path(name: str) -> Path:
    """Path of a built-in prompt set inside the installed package (``raycpt/assets``)."""
    return ASSETS / BUILTIN[name]


def gloss_texts(limit: int) -> list[str]:
    """The first ``limit`` WordNet glosses of the shipped asset, taken in turn from each part of
    speech (noun, verb, adjective, adverb, noun, ...), so a small set still covers all four."""
    if not GLOSSES_FILE.is_file():
        raise RaycptError(f"{GLOSSES}: {GLOSSES_FILE} is missing from the installed package; reinstall raycpt "
                          "or run scripts/make_wordnet_glosses.py")
    per_pos: dict[str, list[str]] = {}
    with gzip.open(GLOSSES_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            m = _POS.match(text)
            group = per_pos.setdefault(m.group(1) if m else "", [])
            if len(group) < limit:
                group.append(text)
    rounds = [t for row in itertools.zip_longest(*per_pos.values()) for t in row if t is not None]
    return rounds[:limit]


def load_prompt_records(source: str) -> list[PromptRecord]:
    """Read ``builtin:NAME`` or a JSONL file of ``{s1, s2, group[, answer]}`` records.

    Every problem is a :class:`RaycptError` naming the file and the 1-based line number.
    """
    if source.startswith("builtin:"):
        if source not in BUILTIN:
            raise RaycptError(f"unknown built-in prompt set {source!r}: choose one of {', '.join(BUILTIN)} "
                              "or give a JSONL file of {s1, s2, group} records")
        path = builtin_path(source)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            raise RaycptError(f"prompt file {path} is a directory; expected a JSONL file of {{s1, s2, group}} records")
        if not path.is_file():
            raise RaycptError(f"prompt file not found: {path} (expected JSONL of {{s1, s2, group}} records)")
    text = read_user_text(path, "prompt file")
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"prompt file {path} line {n}"
        obj = json_record(line, where, REQUIRED)
        for k in REQUIRED:
            if not isinstance(obj[k], str):
                raise RaycptError(f"{where}: field {k} must be a string, got {type(obj[k]).__name__}")
        for k in ("s1", "s2", "group"):
            if not obj[k].strip():
                raise RaycptError(f"{where}: {k} is empty")
        answer = obj.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise RaycptError(f"{where}: field answer must be a string when given, got {type(answer).__name__}")
        records.append(PromptRecord(s1=obj["s1"], s2=obj["s2"], group=obj["group"], answer=answer or None,
                                    line=n, source=str(path)))
    if not records:
        raise RaycptError(f"prompt file {path} is empty: expected JSON lines of {{s1, s2, group}} records")
    return records


MIN_INTERVAL_PROMPTS = 10
"""Fewer distinct prompts than this: S(b)'s bootstrap-over-prompts interval is printed with a warning (a
percentile bootstrap of a handful of values covers far less often than it says)."""


def check_prompt_set(records: list[PromptRecord], warn=None) -> None:
    """Refuse a prompt set with a repeated prompt (the same s1 and s2: it would count twice and narrow S(b)'s
    interval; four copies of one prompt gave a zero-width interval), naming both lines; ``warn`` (one line)
    when fewer than :data:`MIN_INTERVAL_PROMPTS` prompts are left for the interval."""
    seen: dict[tuple[str, str], PromptRecord] = {}
    for r in records:
        first = seen.setdefault((r.s1, r.s2), r)
        if first is not r:
            raise RaycptError(f"prompt file {r.source} line {r.line} repeats line {first.line} (the same s1 and s2): "
                              "a repeated prompt counts twice and narrows S(b)'s interval; remove the repeats")
    if len(records) < MIN_INTERVAL_PROMPTS and warn is not None:
        warn(f"warning: S(b) on {len(records)} prompts: its interval (a bootstrap over prompts) needs at least "
             f"{MIN_INTERVAL_PROMPTS} to mean much; add prompts or raise trace.max_prompts")


def _require_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise RaycptError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer: LayerTracer needs "
                          "character offsets (a tokenizer.json) to find the s1/s2 token positions")


def encode_prompt(record: PromptRecord, tokenizer, index: int = 0) -> EncodedPrompt:
    """Tokenise ``s1 + s2`` once and sort every token into context, query or neither."""
    _require_fast(tokenizer)
    text = record.s1 + record.s2
    cut = len(record.s1)
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    special = list(enc["special_tokens_mask"])
    where = f"prompt file {record.source} line {record.line}" if record.source else f"prompt {index}"
    context, query, seam_space = [], [], False
    for pos, ((start, end), sp) in enumerate(zip(offsets, special)):
        if sp or end <= start:
            continue
        if start < cut < end:
            if text[start:cut].strip():
                piece = text[start:end]
                raise RaycptError(
                    f"{where}: the s1/s2 boundary (character {cut}) falls inside token {piece!r} (characters "
                    f"{start}-{end}); end s1 or start s2 where this tokenizer starts a new token")
            seam_space = True  # only s1's trailing whitespace is in it: the token belongs to s2
        (context if end <= cut else query).append(pos)
    if not context:
        raise RaycptError(f"{where}: s1 {record.s1!r} gives no tokens to perturb")
    if not query:
        raise RaycptError(f"{where}: s2 {record.s2!r} gives no query tokens")
    last = query[-1]
    ids = ids[:last + 1]  # drop trailing special tokens (EOS): the traced position is the last query token
    answer_id = -1
    if record.answer:
        full = tokenizer(text + record.answer, add_special_tokens=True)["input_ids"]
        if len(full) > last + 1 and list(full[:last + 1]) == ids:
            answer_id = int(full[last + 1])
    return EncodedPrompt(index=index, group=record.group, input_ids=[int(i) for i in ids], context=context,
                         query=query, last=last, answer_id=answer_id, line=record.line, seam_space=seam_space)


def encode_prompts(records: Sequence[PromptRecord], tokenizer) -> list[EncodedPrompt]:
    _require_fast(tokenizer)
    return [encode_prompt(r, tokenizer, i) for i, r in enumerate(records)]


def pad_id_of(tokenizer) -> int:
    for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


def collate(prompts: Sequence[EncodedPrompt], pad_id: int = 0):
    """Right-padded batch: ``input_ids``, ``attention_mask``, ``context_mask`` (bool) and ``last``.

    Right padding keeps every real position's causal view unchanged, so padded rows give the same
    numbers as unpadded ones (up to float rounding) and ``last`` is each row's own last token.
    """
    import torch

    width = max(len(p.input_ids) for p in prompts)
    b = len(prompts)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, width), dtype=torch.long)
    context_mask = torch.zeros((b, width), dtype=torch.bool)
    for r, p in enumerate(prompts):
        n = len(p.input_ids)
        input_ids[r, :n] = torch.tensor(p.input_ids, dtype=torch.long)
        attention_mask[r, :n] = 1
        context_mask[r, p.context] = True
    last = torch.tensor([p.last for p in prompts], dtype=torch.long)
    return dict(input_ids=input_ids, attention_mask=attention_mask, context_mask=context_mask, last=last)
