#!/usr/bin/env python
"""Build raycpt's built-in training corpus from WordNet 3.0 glosses (Debian ``wordnet-base``).

Output: ``raycpt/assets/wordnet_glosses.jsonl.gz``, one JSON record per synset::

    {"text": "able (adjective): (usually followed by `to') having the necessary means or skill ...;
              \"able to swim\"; \"she was able to program her computer\""}

``text`` is the synset's lemmas (underscores as spaces, adjective markers such as ``(p)``
dropped), its part of speech, and its gloss: the definition followed by WordNet's quoted usage
examples, exactly as WordNet writes them. Records are in file order (noun, verb, adjective,
adverb; each by synset offset, the kept subset in that order), so the output is reproducible byte for byte (gzip with mtime 0).

To keep the shipped file small (a few MB), ``--max-chars`` caps the total text: synsets are
taken in a fixed order (every synset whose gloss carries a usage example first, then the rest),
stopping at the cap. Licence: WordNet 3.0 licence (permissive, with notice), see
``raycpt/assets/WORDNET_LICENSE.txt``.

Run: ``python scripts/make_wordnet_glosses.py [--wordnet /usr/share/wordnet] [--max-chars 4000000]``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
from pathlib import Path

POS_FILES = [("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r")]
POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
ASSETS = Path(__file__).resolve().parent.parent / "raycpt" / "assets"


def parse_line(line: str) -> dict | None:
    """One ``data.*`` line -> {offset, pos, lemmas, gloss}; None for the licence header lines."""
    if line.startswith("  ") or "|" not in line:
        return None
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    offset, pos, w_cnt = int(fields[0]), fields[2], int(fields[3], 16)
    lemmas = []
    for j in range(w_cnt):
        word = fields[4 + 2 * j]
        word = re.sub(r"\((a|p|ip)\)$", "", word).replace("_", " ")
        if word not in lemmas:
            lemmas.append(word)
    return {"offset": offset, "pos": pos, "lemmas": lemmas, "gloss": gloss.strip()}


def document(rec: dict) -> str:
    return f"{', '.join(rec['lemmas'])} ({POS_NAME[rec['pos']]}): {rec['gloss']}"


def build(wordnet: Path, max_chars: int | None) -> list[dict]:
    recs = []
    for fname, _ in POS_FILES:
        with open(wordnet / f"data.{fname}", encoding="utf-8", errors="replace") as f:
            for line in f:
                r = parse_line(line)
                if r is not None and r["gloss"]:
                    recs.append(r)
    docs = [{"text": document(r)} for r in recs]
    if max_chars is None or sum(len(d["text"]) for d in docs) <= max_chars:
        return docs
    with_example = [i for i, r in enumerate(recs) if '"' in r["gloss"]]
    without = [i for i, r in enumerate(recs) if '"' not in r["gloss"]]
    keep, total = set(), 0
    for i in with_example + without:
        n = len(docs[i]["text"])
        if total + n > max_chars:
            break
        keep.add(i)
        total += n
    return [d for i, d in enumerate(docs) if i in keep]


def write(docs: list[dict], out: Path) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9, filename="") as gz:
        for d in docs:
            gz.write((json.dumps(d, ensure_ascii=False) + "\n").encode("utf-8"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wordnet", default="/usr/share/wordnet", help="folder with data.noun, data.verb, ...")
    ap.add_argument("--out", default=str(ASSETS / "wordnet_glosses.jsonl.gz"))
    ap.add_argument("--max-chars", type=int, default=4_000_000, help="cap on the total text (0 = no cap)")
    a = ap.parse_args()
    wn = Path(a.wordnet)
    if not (wn / "data.noun").is_file():
        raise SystemExit(f"WordNet data not found under {wn}: apt-get install wordnet-base")
    docs = build(wn, a.max_chars or None)
    write(docs, Path(a.out))
    chars = sum(len(d["text"]) for d in docs)
    print(f"wrote {len(docs)} documents, {chars:,} characters, {Path(a.out).stat().st_size:,} bytes -> {a.out}")


if __name__ == "__main__":
    main()
