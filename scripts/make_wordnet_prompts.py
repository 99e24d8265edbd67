#!/usr/bin/env python
"""Build raycpt's built-in LayerTracer prompt set from WordNet 3.0 (Debian ``wordnet-base``).

Output: ``raycpt/assets/wordnet_lexical.jsonl``, 500 records in 10 groups of 50, each
``{"s1", "s2", "group", "answer", "query", "relation"}``, in the paper's template
(LayerTracer, appendix B: ``Example: [pair_1], [pair_2];Query: [target_word]->``)::

    s1 = "Example: hot->Cold, big->Small;"
    s2 = " Query: fast->"                   (the expected answer is "Slow")

The boundary between s1 and s2 sits right before the space of `` Query``. Byte-level BPE
tokenizers (SmolLM2, GPT-2, Llama 3, Qwen) pre-split text so that a space starts the following
word (`` Query`` is one pre-token and ``;`` is a punctuation pre-token of its own), and
SentencePiece-style tokenizers (Gemma) attach the space to the following word as ``▁Query``, so
with the space on the s2 side the boundary falls on a token boundary for both families. (With
the space at the end of s1 instead, byte-level BPE would make ``; `` or `` Query`` straddle it.)
The answer is capitalised as in the paper's Table 8 (``good->Bad``).

Groups (10 x 50):

* ``antonym_adj``, ``antonym_noun``, ``antonym_verb``, ``antonym_adv``: WordNet's lexical
  antonymy pointer ``!`` (the AntSynNET relation of the paper), by part of speech;
* ``synonym_adj``, ``synonym_noun``, ``synonym_verb``, ``synonym_adv``: two different
  one-word lemmas of the same synset (AntSynNET's other relation), by part of speech;
* ``hypernym_noun``: noun -> its direct hypernym (pointer ``@``, e.g. ``oak->Tree``): a
  knowledge-retrieval relation, the "Knowledge" side of the paper's task categories;
* ``pertainym_adv``: adverb -> the adjective it is derived from (pointer ``\\``, e.g.
  ``quickly->Quick``): a near-algorithmic, surface-form relation, the "Algorithmic" side.

Word choice is deterministic. Each (word, synset) sense gets its SemCor tag count from
``cntlist.rev`` (and each word its total count over all senses); a pair scores the smaller of its
two words' sense counts, ties broken by the smaller word count, so pairs of common words come
first (pairs with a word never seen in SemCor are not used). Only lowercase ASCII one-word lemmas of 3-12 letters are used; a pair whose two words share
a 4-letter prefix is skipped for synonyms/antonyms/hypernyms (``happy->Unhappy`` is spelling, not
meaning). The 50 best pairs with distinct queries become the queries; the two examples of each
prompt are drawn (``random.Random(seed)``) from the group's next-best pairs, never reusing the
query's words. Run: ``python scripts/make_wordnet_prompts.py [--wordnet /usr/share/wordnet]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "raycpt" / "assets" / "wordnet_lexical.jsonl"
LICENSE_OUT = ROOT / "raycpt" / "assets" / "WORDNET_LICENSE.txt"
LICENSE_SRC = Path("/usr/share/doc/wordnet-base/copyright")

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
SS_NUM = {"n": 1, "v": 2, "a": 3, "r": 4, "s": 5}
PER_GROUP = 50
EXAMPLE_POOL = 150  # examples are drawn from the group's best pairs up to this rank
WORD_RE = re.compile(r"^[a-z]{3,12}$")


def parse_data(path: Path) -> dict[str, dict]:
    """offset -> {pos, lexfile, words: [(lemma, lex_id)], ptrs: [(sym, offset, pos, src, tgt)]}."""
    synsets = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # licence header
            data = line.split(" | ")[0].split()
            offset, lexfile, ss_type = data[0], int(data[1]), data[2]
            w_cnt = int(data[3], 16)
            words = []
            k = 4
            for _ in range(w_cnt):
                lemma = re.sub(r"\([a-z]+\)$", "", data[k])  # adjective markers (a), (p), (ip)
                words.append((lemma, int(data[k + 1], 16)))
                k += 2
            p_cnt = int(data[k])
            k += 1
            ptrs = []
            for _ in range(p_cnt):
                sym, off, pos, st = data[k:k + 4]
                ptrs.append((sym, off, pos, int(st[:2], 16), int(st[2:], 16)))
                k += 4
            synsets[offset] = dict(pos=ss_type, lexfile=lexfile, words=words, ptrs=ptrs)
    return synsets


def parse_counts(path: Path) -> dict[tuple, int]:
    """(lemma, ss_num, lexfile, lex_id) -> SemCor tag count of that sense, and (lemma,) -> the word's
    total over all senses, from ``cntlist.rev``."""
    counts: dict[tuple, int] = defaultdict(int)
    with open(path, encoding="latin-1") as f:
        for line in f:
            key, _sense, cnt = line.split()
            lemma, rest = key.split("%", 1)
            ss, lexfile, lexid = rest.split(":")[:3]
            counts[(lemma.lower(), int(ss), int(lexfile), int(lexid))] += int(cnt)
            counts[(lemma.lower(),)] += int(cnt)
    return counts


def sense_count(counts, lemma: str, lex_id: int, syn: dict) -> tuple[int, int]:
    """(tag count of this sense, tag count of the word over all its senses): the sense count ranks
    first, the word count breaks ties (many adverb and verb senses were never tagged)."""
    return (counts.get((lemma.lower(), SS_NUM[syn["pos"]], syn["lexfile"], lex_id), 0),
            counts.get((lemma.lower(),), 0))


def pair_score(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    """A pair is as common as its rarer word: elementwise minimum of the two words' counts."""
    return min(x[0], y[0]), min(x[1], y[1])


def good_word(w: str) -> bool:
    return bool(WORD_RE.match(w))


def related(a: str, b: str) -> bool:
    return a == b or a[:4] == b[:4] or a in b or b in a


def collect(db: dict[str, dict[str, dict]], counts) -> dict[str, list[tuple[tuple, str, str]]]:
    """group -> [(score, query, answer)] of all candidate pairs."""
    groups: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)

    def add(group, q, a, score, allow_related=False):
        if not (good_word(q) and good_word(a)) or score[1] <= 0:
            return
        if q == a or (not allow_related and related(q, a)):
            return
        key = (q, a)
        groups[group][key] = max(groups[group].get(key, (0, 0)), score)

    for pos, name in POS_FILES.items():
        synsets = db[pos]
        for syn in synsets.values():
            words = syn["words"]
            # antonyms: lexical pointer "!" from word src to word tgt of the target synset
            for sym, off, tpos, src, tgt in syn["ptrs"]:
                if sym != "!" or src == 0:
                    continue
                target = db["a" if tpos == "s" else tpos][off]
                (q, qid), (a, aid) = words[src - 1], target["words"][tgt - 1]
                score = pair_score(sense_count(counts, q, qid, syn), sense_count(counts, a, aid, target))
                add(f"antonym_{name}", q, a, score)
            # synonyms: two different lemmas of one synset
            for i, (q, qid) in enumerate(words):
                for j, (a, aid) in enumerate(words):
                    if i != j:
                        score = pair_score(sense_count(counts, q, qid, syn), sense_count(counts, a, aid, syn))
                        add(f"synonym_{name}", q, a, score)
            if pos == "n":  # hypernyms: every lemma -> each lemma of a direct hypernym synset
                for sym, off, tpos, _s, _t in syn["ptrs"]:
                    if sym not in ("@", "@i"):
                        continue
                    target = synsets[off]
                    for q, qid in words:
                        for a, aid in target["words"]:
                            score = pair_score(sense_count(counts, q, qid, syn), sense_count(counts, a, aid, target))
                            add("hypernym_noun", q, a, score)
            if pos == "r":  # pertainyms: adverb -> the adjective it derives from (lexical pointer "\")
                for sym, off, tpos, src, tgt in syn["ptrs"]:
                    if sym != "\\" or src == 0:
                        continue
                    target = db["a"][off]
                    (q, qid), (a, aid) = words[src - 1], target["words"][tgt - 1]
                    score = pair_score(sense_count(counts, q, qid, syn), sense_count(counts, a, aid, target))
                    add("pertainym_adv", q, a, score, allow_related=True)
    return {g: sorted(((s, q, a) for (q, a), s in pairs.items()), key=lambda t: (-t[0][0], -t[0][1], t[1], t[2]))
            for g, pairs in groups.items()}


GROUP_ORDER = ["antonym_adj", "antonym_noun", "antonym_verb", "antonym_adv",
               "synonym_adj", "synonym_noun", "synonym_verb", "synonym_adv",
               "hypernym_noun", "pertainym_adv"]


def build_prompts(cands: dict[str, list[tuple[tuple, str, str]]], seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for group in GROUP_ORDER:
        pairs = cands.get(group, [])
        # best score first: first pairs whose two words are both new, then (small groups such as
        # adverb antonyms) the reverse directions of pairs already taken, so each query is distinct
        seen_q, seen_a, uniq = set(), set(), []
        for _s, q, a in pairs:
            if q in seen_q or a in seen_a or q in seen_a or a in seen_q:
                continue
            seen_q.add(q)
            seen_a.add(a)
            uniq.append((q, a))
        for _s, q, a in pairs:
            if q not in seen_q and (q, a) not in uniq:
                seen_q.add(q)
                uniq.append((q, a))
        if len(uniq) < PER_GROUP + 2:
            raise SystemExit(f"group {group}: only {len(uniq)} usable pairs")
        queries = uniq[:PER_GROUP]
        pool = uniq[:EXAMPLE_POOL]
        for q, a in queries:
            ex = []
            while len(ex) < 2:
                e = pool[rng.randrange(len(pool))]
                used = {q, a} | {w for p in ex for w in p}
                if e[0] in used or e[1] in used:
                    continue
                ex.append(e)
            (a1, b1), (a2, b2) = ex
            s1 = f"Example: {a1}->{b1.capitalize()}, {a2}->{b2.capitalize()};"
            s2 = f" Query: {q}->"
            records.append(dict(s1=s1, s2=s2, group=group, answer=a.capitalize(), query=q,
                                relation=group.split("_")[0]))
    return records


def write_license(path: Path) -> None:
    """WordNet 3.0 licence notice (from the Debian copyright file); written only if missing."""
    if path.exists():
        return
    text = LICENSE_SRC.read_text(encoding="utf-8")
    block = text.split("Files: debian/*")[0]
    body = []
    for line in block.splitlines():
        if line.startswith(" "):
            body.append("" if line.strip() == "." else line[1:])
    notice = ("raycpt ships data derived from WordNet 3.0 (Princeton University), read from the Debian\n"
              "package wordnet-base. The WordNet licence follows.\n\n"
              "WordNet Release 3.0. Copyright (c) 1996-2012 Cognitive Science Laboratory, Princeton\n"
              "University. Source: http://wordnet.princeton.edu/\n\n" + "\n".join(body).strip() + "\n")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(notice, encoding="utf-8")
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wordnet", default="/usr/share/wordnet", help="WordNet dict folder")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    wn = Path(args.wordnet)
    if not (wn / "data.noun").is_file():
        print(f"WordNet not found under {wn} (apt-get install wordnet-base)", file=sys.stderr)
        return 2
    db = {pos: parse_data(wn / f"data.{name}") for pos, name in POS_FILES.items()}
    counts = parse_counts(wn / "cntlist.rev")
    records = build_prompts(collect(db, counts), args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    write_license(LICENSE_OUT if out.parent == OUT.parent else out.parent / LICENSE_OUT.name)
    by_group = defaultdict(int)
    for r in records:
        by_group[r["group"]] += 1
    print(f"wrote {len(records)} prompts to {out}: " + ", ".join(f"{g}={n}" for g, n in by_group.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
