"""The document-aware held-out loss: each document of a packed token block scored on its own, in nats and bits
per byte.

A held-out block (the held-out domain documents, the validation slice, the general probe) is ``seq_len`` tokens
cut from documents joined with EOS, as training packs them. Scoring the block in one causal forward lets every
token after an EOS see the previous document, and counts two targets that measure the packing rather than the
text: the EOS itself (where a document ends) and the first token after it (what follows an end of document). On
the default sweep those two classes, 7% of the targets, carried 44% of the held-out loss's change and 67% of the
general probe's (issue 50). So here:

* a block is cut at its EOS tokens into *runs*: the maximal stretches of non-EOS tokens, each one document (or
  the part of it that lies inside the block);
* each run is scored in its own forward, from its own first token (after the tokenizer's BOS when the tokenizer
  puts one before every text, :func:`prefix_id_of`; the BOS is context only), so no context holds another
  document or an EOS;
* the counted targets are the run's tokens after its first: token ``j`` of a run predicted from tokens
  ``0..j-1`` of the same run. Not counted: the EOS (it ends a document and has no text), the first token of
  each run (its context is empty, or the block's cut), and nothing else.

A block's loss is the mean cross-entropy (nats, float32 logits) over its counted targets; its weight is their
number (0 for a block without one; it then counts for nothing in a token-weighted mean). Bits per byte: the
counted targets' summed cross-entropy divided by ``ln 2`` and by the UTF-8 bytes of their text, which for a run
is ``len(decode(run).encode()) - len(decode(run[:1]).encode())`` (the run's text less its first token's;
:func:`counted_bytes`). docs/analysis.md, "Document-aware losses", says why this rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

DEFINITION = "per-document"
"""What the held-out, validation and general losses mean (recorded with them): each document scored on its own."""


@dataclass(frozen=True)
class BlockScores:
    """Per block: the mean cross-entropy of its counted targets (``losses``, nats; 0.0 without one), their number
    (``targets``: the weights of a token-weighted mean) and the UTF-8 bytes of their text (``bytes``, when a
    tokenizer was given)."""

    losses: list[float]
    targets: list[int]
    bytes: Optional[list[int]] = None

    def loss(self) -> float:
        """The token-weighted mean over every counted target (nats); NaN without one."""
        return weighted_loss(self.losses, self.targets)

    def bpb(self) -> Optional[float]:
        """Bits per byte over every counted target; None without bytes."""
        return bits_per_byte(self.losses, self.targets, self.bytes) if self.bytes is not None else None


def weighted_loss(losses: Sequence[float], targets: Sequence[int]) -> float:
    n = sum(targets)
    return sum(x * k for x, k in zip(losses, targets)) / n if n else math.nan


def bits_per_byte(losses: Sequence[float], targets: Sequence[int], nbytes: Sequence[int]) -> float:
    """Summed cross-entropy of the counted targets in bits over the bytes of their text; NaN without a byte."""
    b = sum(nbytes)
    return sum(x * k for x, k in zip(losses, targets)) / math.log(2) / b if b else math.nan


def document_runs(block: Sequence[int], eos_id: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: the maximal stretches ``block[start:end]`` holding no ``eos_id``, in order."""
    runs, start = [], 0
    for i, t in enumerate(block):
        if t == eos_id:
            if i > start:
                runs.append((start, i))
            start = i + 1
    if len(block) > start:
        runs.append((start, len(block)))
    return runs


def counted_targets(block: Sequence[int], eos_id: int) -> list[bool]:
    """For each target of the block (positions 1..len-1), whether it counts: a non-EOS token that is not the first
    of its run."""
    mask = [False] * len(block)
    for s, e in document_runs(block, eos_id):
        for j in range(s + 1, e):
            mask[j] = True
    return mask[1:]


def prefix_id_of(tokenizer) -> Optional[int]:
    """The BOS id when the tokenizer puts one before every text it encodes (as lm-eval's rolling log-likelihood
    does, a run then starts after it), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def counted_bytes(tokenizer, run: Sequence[int]) -> int:
    """UTF-8 bytes of the text of a run's counted targets (every token after its first)."""
    if len(run) < 2:
        return 0

    def size(ids):
        return len(tokenizer.decode(list(ids), clean_up_tokenization_spaces=False).encode("utf-8"))

    return size(run) - size(run[:1])


def token_losses(model, ids, chunk_tokens: Optional[int] = None):
    """``(batch, len - 1)`` float32 next-token cross-entropies of ``ids`` in one forward (no KV cache). With
    ``chunk_tokens`` the head and the cross-entropy run that many rows at a time on the decoder's final hidden
    states (with the model's ``final_logit_softcapping``), so the full logits never exist; the head must be a plain
    ``Linear`` without extra scaling (:func:`raycpt.train.worker.loss.chunked_supported`)."""
    import torch

    targets = ids[:, 1:].reshape(-1)
    if chunk_tokens is None:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="none")
        return ce.view(ids.shape[0], -1)
    head, cap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
    h = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
    rows = h.reshape(-1, h.shape[-1])
    ce = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    for s in range(0, rows.shape[0], chunk_tokens):
        z = head(rows[s:s + chunk_tokens]).float()
        if cap:
            z = torch.tanh(z / cap) * cap
        ce[s:s + chunk_tokens] = torch.nn.functional.cross_entropy(z, targets[s:s + chunk_tokens], reduction="none")
    return ce.view(ids.shape[0], -1)


def _batches(runs: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """Runs (longest first) grouped so that a group's rows times its longest run stay within ``budget`` tokens."""
    out: list[list[tuple[int, int, int]]] = []
    for r in sorted(runs, key=lambda r: r[1] - r[2]):
        if out and (len(out[-1]) + 1) * (out[-1][0][2] - out[-1][0][1]) <= budget:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def document_block_scores(model, blocks: list[list[int]], eos_id: int, batch_size: int = 8,
                          prefix_id: Optional[int] = None, tokenizer=None,
                          chunk_tokens: Optional[int] = None, budget_tokens: Optional[int] = None) -> BlockScores:
    """Every block's documents scored on their own (module docstring): its loss over its counted targets, their
    number and, with ``tokenizer``, their bytes. The runs are right-padded into forwards of about
    ``budget_tokens`` tokens (``eval.loss_batch_tokens``; None: ``batch_size`` blocks' tokens) (causal attention: the
    padding after a run changes nothing before it).
    ``prefix_id`` (:func:`prefix_id_of`) goes before every run as context. The model runs in eval mode without
    the KV cache and is left in the mode it was in."""
    import torch

    pre = [] if prefix_id is None else [int(prefix_id)]
    runs = [(i, s, e) for i, b in enumerate(blocks) for s, e in document_runs(b, eos_id) if e - s >= 2]
    nll, count = [0.0] * len(blocks), [0] * len(blocks)
    budget = budget_tokens or batch_size * max((len(b) for b in blocks), default=1)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for group in _batches(runs, budget):
                width = len(pre) + max(e - s for _, s, e in group)
                rows = [pre + list(blocks[i][s:e]) for i, s, e in group]
                ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
                ce = token_losses(model, ids, chunk_tokens).double()
                for k, (i, s, e) in enumerate(group):
                    nll[i] += float(ce[k, len(pre):len(pre) + e - s - 1].sum())  # targets: run tokens 1..e-s-1
                    count[i] += e - s - 1
    finally:
        if was_training:
            model.train()
    nbytes = None
    if tokenizer is not None:
        nbytes = [sum(counted_bytes(tokenizer, b[s:e]) for s, e in document_runs(b, eos_id)) for b in blocks]
    return BlockScores([x / n if n else 0.0 for x, n in zip(nll, count)], count, nbytes)


def lm_block_losses(model, blocks: list[list[int]], eos_id: int, batch_size: int = 8,
                    prefix_id: Optional[int] = None) -> list[float]:
    """Per block, the mean cross-entropy (nats) of its counted targets (:func:`document_block_scores`)."""
    return document_block_scores(model, blocks, eos_id, batch_size, prefix_id).losses


def lm_loss(model, blocks: list[list[int]], eos_id: int, batch_size: int = 8,
            prefix_id: Optional[int] = None) -> float:
    """The held-out loss: the mean cross-entropy (nats) over every counted target of the blocks, each document
    scored on its own (:func:`document_block_scores`)."""
    return document_block_scores(model, blocks, eos_id, batch_size, prefix_id).loss()
