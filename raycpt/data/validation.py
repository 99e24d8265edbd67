"""The validation slice: documents never trained on and disjoint from the held-out test documents, on which a sweep
picks each method's learning rate (``sweep.lr_grid``) before the held-out loss reports the picked run.

With ``data.heldout_share`` > 0 the hash holds a set of documents out of training (:func:`is_heldout`); the
held-out test sample is an evenly spaced ``heldout_docs`` of them (:func:`raycpt.data.corpus.heldout_documents`);
the validation slice is an evenly spaced ``num_docs`` of the rest, with every text the test sample holds left out
(duplicated glosses). With share 0 the test documents are the ``heldout_docs`` after ``data.max_documents`` and the
validation slice the ``num_docs`` after those. Deterministic: a function of the config alone. Its loss, like the
held-out loss, scores each document of a block on its own (:mod:`raycpt.evaluate.heldout`).
"""

from __future__ import annotations

import numpy as np

from raycpt.data.corpus import HeldoutBlocks, heldout_documents, is_heldout, iter_documents, pack_documents
from raycpt.errors import RaycptError


def validation_documents(data_cfg, num_docs: int, heldout_docs: int) -> list[str]:
    """The validation documents (module docstring); RaycptError (one line) when too few remain."""
    share = float(getattr(data_cfg, "heldout_share", 0.0) or 0.0)
    test = set(heldout_documents(data_cfg, heldout_docs, "sweep.heldout_docs")) if heldout_docs else set()
    if share <= 0:
        if data_cfg.max_documents is None:
            raise RaycptError("sweep.validation_docs needs data.heldout_share > 0 or data.max_documents: the "
                              "validation documents are held out of training like the held-out ones")
        start = int(data_cfg.max_documents) + int(heldout_docs)
        docs = list(iter_documents(data_cfg.corpus, data_cfg.text_field, max_documents=start + num_docs))[start:]
        docs = [d for d in docs if d not in test]
    else:
        seed = int(getattr(data_cfg, "heldout_seed", 0))
        rest = [d for d in iter_documents(data_cfg.corpus, data_cfg.text_field, data_cfg.max_documents)
                if is_heldout(d, share, seed) and d not in test]
        pick = np.unique(np.round(np.linspace(0, len(rest) - 1, num_docs)).astype(np.int64)) if rest else []
        docs = [rest[i] for i in pick] if len(rest) >= num_docs else []
    if len(docs) < num_docs:
        raise RaycptError(f"sweep.validation_docs={num_docs}: the corpus leaves {len(docs)} documents that are "
                          f"neither trained on nor among the {heldout_docs} held-out test documents; lower "
                          "sweep.validation_docs or raise data.heldout_share")
    return docs


def validation_blocks(data_cfg, tokenizer_path: str, num_docs: int, heldout_docs: int) -> HeldoutBlocks:
    """:func:`validation_documents` packed into ``data.seq_len`` blocks the way training packs (``.documents``: the
    document of each block)."""
    blocks, docs = pack_documents(validation_documents(data_cfg, num_docs, heldout_docs), data_cfg, tokenizer_path,
                                  f"sweep.validation_docs={num_docs}", "sweep.validation_docs")
    out = HeldoutBlocks(blocks)
    out.documents = docs
    return out
