#!/usr/bin/env python
"""Generate the offline benchmark ``raycpt/assets/wordnet_mc.jsonl`` from WordNet 3.0.

C-Eval format, one question a line: ``{id, question, A, B, C, D, answer, category, pos, word, synset}``.

Each question asks which word has a given WordNet definition (the gloss of the word's most
frequent sense, examples stripped). The four options are words of the same part of speech; the
three distractors are drawn deterministically (a seeded RNG per question) from common words of that
part of speech that are not synonyms of the answer, not in a synset linked to the answer's synset,
not a morphological neighbour of the answer and not a word of the definition. Only common words
(SemCor tag count >= MIN_COUNT in ``cntlist.rev``) are used, as answers and as distractors, and the
answer never appears in its own definition.

Categories follow the part of speech (the four slots of the paper's table; the names are labels):
noun -> STEM, verb -> Social Science, adjective -> Humanities, adverb -> Other.

Questions are interleaved by category (noun, verb, adj, adv, noun, ...) so that the first N
questions (``eval.limit=N``) are balanced; answer letters are balanced within each category.

The definitions are WordNet glosses, the text of the default training corpus
(``builtin:wordnet-glosses``, ``raycpt/assets/wordnet_glosses.jsonl.gz``, records
``"lemma, lemma (pos): definition; examples"``). That corpus is a capped subset of the synsets, so
when its file is present only synsets whose record (same part of speech, same definition, the answer
among its lemmas) is in it are asked about; without it, all synsets qualify (and the script says so).

Usage: ``python scripts/make_wordnet_benchmark.py [--wordnet /usr/share/wordnet] [--corpus GZ] [--out PATH] [--per-category 100]``
Deterministic: the same WordNet files give the same file byte for byte.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "raycpt" / "assets" / "wordnet_mc.jsonl"
LICENSE_OUT = ROOT / "raycpt" / "assets" / "WORDNET_LICENSE.txt"
LICENSE_SRC = Path("/usr/share/doc/wordnet-base/copyright")
DEFAULT_CORPUS = ROOT / "raycpt" / "assets" / "wordnet_glosses.jsonl.gz"
CORPUS_POS = {"noun": "n", "verb": "v", "adjective": "a", "adverb": "r"}

SEED = 20240531
MIN_COUNT = 10
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
CATEGORY = {"n": "STEM", "v": "Social Science", "a": "Humanities", "r": "Other"}
SS_TYPE_POS = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}
# pointers that make a word too close to the answer to be a fair distractor
CLOSE_POINTERS = {"@", "@i", "~", "~i", "&", "$", "^", "=", "+", "\\", "<", "*", ">"}
LETTERS = "ABCD"


def _clean_word(w: str) -> str:
    return re.sub(r"\((a|p|ip)\)$", "", w).lower()


def read_counts(wn: Path) -> dict[tuple[str, str], int]:
    """(lemma, pos) -> summed SemCor tag count over its senses."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for line in (wn / "cntlist.rev").read_text(encoding="utf-8").splitlines():
        key, _, cnt = line.split()
        lemma, rest = key.split("%", 1)
        counts[(lemma, SS_TYPE_POS[rest.split(":")[0]])] += int(cnt)
    return counts


def read_synsets(wn: Path, pos: str) -> dict[str, dict]:
    """offset -> {words, gloss, close (offsets linked by a close pointer)}."""
    out = {}
    for line in (wn / f"data.{POS_FILES[pos]}").read_text(encoding="utf-8").splitlines():
        if line.startswith("  "):
            continue
        head, _, gloss = line.partition(" | ")
        f = head.split()
        offset, w_cnt = f[0], int(f[3], 16)
        words = [_clean_word(f[4 + 2 * i]) for i in range(w_cnt)]
        i = 4 + 2 * w_cnt
        p_cnt = int(f[i])
        close = set()
        for j in range(p_cnt):
            sym, target, tpos = f[i + 1 + 4 * j], f[i + 2 + 4 * j], f[i + 3 + 4 * j]
            if sym in CLOSE_POINTERS:
                close.add((SS_TYPE_POS.get(tpos, tpos) if tpos != "s" else "a", target))
        out[offset] = {"words": words, "gloss": gloss.strip(), "close": close}
    return out


def read_index(wn: Path, pos: str) -> dict[str, list[str]]:
    """lemma -> synset offsets, most frequent sense first."""
    out = {}
    for line in (wn / f"index.{POS_FILES[pos]}").read_text(encoding="utf-8").splitlines():
        if line.startswith("  "):
            continue
        f = line.split()
        lemma, synset_cnt, p_cnt = f[0], int(f[2]), int(f[3])
        out[lemma] = f[4 + p_cnt + 2:4 + p_cnt + 2 + synset_cnt]
    return out


def definition_of(gloss: str) -> str:
    """The definition part of a gloss: everything before the first quoted example."""
    text = re.split(r';\s*"', gloss, maxsplit=1)[0]
    return text.strip().strip(";").strip()


def read_corpus(path: Path | None) -> set[tuple[str, str, str]] | None:
    """(pos, definition, lemma) triples of the training-corpus records, or None without a corpus file."""
    if path is None or not Path(path).is_file():
        return None
    out = set()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"]
            m = re.match(r"(.*?) \((noun|verb|adjective|adverb)\): (.*)$", text, re.S)
            if not m:
                continue
            definition = definition_of(m.group(3))
            for lemma in m.group(1).split(", "):
                out.add((CORPUS_POS[m.group(2)], definition, lemma.replace(" ", "_").lower()))
    return out


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _related(a: str, b: str) -> bool:
    """Morphological neighbours (quick / quickly, run / running) by a shared 4-letter prefix."""
    n = min(4, len(a), len(b))
    return a[:n] == b[:n]


def build_questions(wn: Path = Path("/usr/share/wordnet"), per_category: int = 100, seed: int = SEED,
                    corpus: Path | None = DEFAULT_CORPUS) -> list[dict]:
    counts = read_counts(wn)
    in_corpus = read_corpus(corpus)
    by_pos: dict[str, list[dict]] = {}
    for pos in "nvar":
        synsets = read_synsets(wn, pos)
        index = read_index(wn, pos)
        pool = sorted(lemma for lemma in index
                      if lemma.isalpha() and lemma.islower() and len(lemma) >= 3
                      and counts.get((lemma, pos), 0) >= MIN_COUNT)
        lemma_synsets = {lemma: set(index[lemma]) for lemma in pool}
        rng = random.Random(f"{seed}:{pos}")
        order = pool[:]
        rng.shuffle(order)
        questions, used_synsets = [], set()
        for lemma in order:
            if len(questions) == per_category:
                break
            offset = index[lemma][0]
            syn = synsets[offset]
            definition = definition_of(syn["gloss"])
            words_in_def = _tokens(definition)
            n_words = len(definition.split())
            if offset in used_synsets or not (3 <= n_words <= 25):
                continue
            if in_corpus is not None and (pos, definition, lemma) not in in_corpus:
                continue
            if any(_related(lemma, w) for w in words_in_def if len(w) >= 3) or lemma in words_in_def:
                continue
            close_offsets = {o for p, o in syn["close"] if p == pos} | {offset}
            close_words = set(syn["words"])
            for o in close_offsets:
                close_words.update(synsets[o]["words"] if o in synsets else [])
            candidates = [w for w in pool
                          if w != lemma and w not in close_words and not _related(w, lemma)
                          and not (lemma_synsets[w] & (lemma_synsets[lemma] | close_offsets))
                          and w not in words_in_def]
            qrng = random.Random(f"{seed}:{pos}:{lemma}")
            distractors: list[str] = []
            for w in qrng.sample(candidates, k=min(len(candidates), 40)):
                if all(not _related(w, d) for d in distractors):
                    distractors.append(w)
                if len(distractors) == 3:
                    break
            if len(distractors) < 3:
                continue
            used_synsets.add(offset)
            questions.append({"word": lemma, "definition": definition, "distractors": distractors,
                              "synset": f"{pos}.{offset}"})
        if len(questions) < per_category:
            raise SystemExit(f"only {len(questions)} usable {POS_FILES[pos]} questions (wanted {per_category})")
        letters = [LETTERS[i % 4] for i in range(per_category)]
        random.Random(f"{seed}:{pos}:letters").shuffle(letters)
        out = []
        for q, letter in zip(questions, letters):
            options = q["distractors"][:]
            options.insert(LETTERS.index(letter), q["word"])
            out.append({
                "question": f'Which word means "{q["definition"]}"?',
                **dict(zip(LETTERS, options)),
                "answer": letter,
                "category": CATEGORY[pos],
                "pos": POS_FILES[pos],
                "word": q["word"],
                "synset": q["synset"],
            })
        by_pos[pos] = out
    rows = []
    for i in range(per_category):
        for pos in "nvar":
            rows.append({"id": f"wordnet_mc-{len(rows):04d}", **by_pos[pos][i]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wordnet", default="/usr/share/wordnet", help="folder holding data.noun, index.noun, cntlist.rev")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS),
                    help="training corpus (gzip JSONL); only its synsets are asked about ('' = all synsets)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--per-category", type=int, default=100)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    corpus = Path(args.corpus) if args.corpus else None
    if corpus is not None and not corpus.is_file():
        print(f"note: corpus {corpus} not found; questions may use synsets outside the training corpus")
        corpus = None
    rows = build_questions(Path(args.wordnet), args.per_category, args.seed, corpus)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out)
    if not LICENSE_OUT.exists() and LICENSE_SRC.exists():
        shutil.copyfile(LICENSE_SRC, LICENSE_OUT)
    print(f"wrote {len(rows)} questions to {out}")


if __name__ == "__main__":
    main()
