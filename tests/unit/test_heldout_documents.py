"""The document-aware held-out loss: scored by hand on a two-document block, and against plain per-document
transformers forwards of a tiny random Llama."""

import math
from types import SimpleNamespace

import pytest
import torch

from raycpt.data.corpus import pack_token_lists
from raycpt.evaluate.heldout import (bits_per_byte, counted_targets, document_block_scores, lm_block_losses, lm_loss,
                                     prefix_id_of)
from tiny import tiny_model, tiny_tokenizer

EOS = 3
# a bigram model: P(next = y | current = x) = W[x][y], whatever came before x
W = [[0.1, 0.4, 0.2, 0.3],
     [0.25, 0.25, 0.4, 0.1],
     [0.3, 0.3, 0.3, 0.1],
     [0.05, 0.05, 0.05, 0.85]]


class Bigram(torch.nn.Module):
    """A fake causal LM whose logits at a position are log W[token there]: its log-softmax is log W exactly."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.log(torch.tensor(table, dtype=torch.float32)), requires_grad=False)
        self.calls = []

    def forward(self, input_ids, use_cache=False):
        self.calls.append(input_ids.tolist())
        return SimpleNamespace(logits=self.table[input_ids])


class Text:
    """A fake tokenizer: id -> text ("a", "bb", "é" = 2 bytes in UTF-8)."""

    words = {0: "a", 1: "bb", 2: "\u00e9"}

    def decode(self, ids, clean_up_tokenization_spaces=False):
        return "".join(self.words[i] for i in ids)


def test_a_two_document_block_by_hand():
    block = [1, 2, EOS, 0, 1]  # document "bb é", EOS, document "a bb"
    model = Bigram(W)
    sc = document_block_scores(model, [block], EOS, tokenizer=Text())
    # counted: 2 after 1 (first document) and 1 after 0 (second document); not counted: the EOS after 2
    # (P = 0.1), the 0 after the EOS (P = 0.05), nor either document's first token
    by_hand = (-math.log(0.4) - math.log(0.4)) / 2
    assert sc.losses == [pytest.approx(by_hand, rel=1e-6)]
    assert sc.targets == [2]
    assert sc.bytes == [2 + 2]  # "é" (2 bytes) and "bb" (2 bytes)
    assert sc.bpb() == pytest.approx(2 * by_hand / math.log(2) / 4, rel=1e-6)
    packed = (-math.log(0.4) - math.log(0.1) - math.log(0.05) - math.log(0.4)) / 4  # the old, packed definition
    assert abs(sc.loss() - packed) > 0.5
    # each document ran in its own forward: no row the model saw holds an EOS
    assert sorted(model.calls[0]) == [[0, 1], [1, 2]]
    assert counted_targets(block, EOS) == [True, False, False, True]


def test_the_target_after_the_boundary_does_not_count():
    block = [1, 2, EOS, 0, 1]
    moved = [row[:] for row in W]
    moved[EOS] = [0.7, 0.1, 0.1, 0.1]  # what follows an EOS: 0 now far likelier
    moved[2] = [0.2, 0.2, 0.3, 0.3]  # the EOS after the first document's last token: likelier too
    a = lm_loss(Bigram(W), [block], EOS)
    b = lm_loss(Bigram(moved), [block], EOS)
    assert a == b
    moved[1] = [0.25, 0.25, 0.2, 0.3]  # a counted target (2 after 1) does move it
    assert lm_loss(Bigram(moved), [block], EOS) == pytest.approx((-math.log(0.2) - math.log(0.4)) / 2, rel=1e-6)


def test_bits_per_byte_is_the_summed_loss_in_bits_over_the_bytes():
    assert bits_per_byte([1.0, 2.0], [3, 1], [5, 0]) == pytest.approx((3 + 2) / math.log(2) / 5)
    assert math.isnan(bits_per_byte([1.0], [0], [0]))


def _per_document_reference(model, pieces, prefix=()):
    """Plain transformers forwards, one per document piece: its tokens after the first as targets."""
    total, n = 0.0, 0
    with torch.no_grad():
        for p in pieces:
            if len(p) < 2:
                continue
            ids = torch.tensor([list(prefix) + list(p)])
            labels = torch.tensor([[-100] * (len(prefix) + 1) + list(p[1:])])
            loss = model(input_ids=ids, labels=labels).loss  # transformers' own shift and mean
            total += float(loss) * (len(p) - 1)
            n += len(p) - 1
    return total, n


@pytest.mark.parametrize("prefix", [None, 1])
def test_the_heldout_loss_equals_per_document_forwards_of_three_documents(prefix):
    model = tiny_model("llama", num_layers=2)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(4, 128, (n,), generator=g).tolist() for n in (7, 5, 9)]
    eos = 2
    pre = () if prefix is None else (prefix,)
    # one block holding the three documents, each followed by EOS (7 + 1 + 5 + 1 + 9 + 1 = 24 tokens)
    one = pack_token_lists(docs, 24, eos).tolist()
    assert len(one) == 1 and one[0].count(eos) == 3
    total, n = _per_document_reference(model, docs, pre)
    got = lm_loss(model, one, eos, batch_size=1, prefix_id=prefix)
    assert got == pytest.approx(total / n, abs=1e-6)
    with torch.no_grad():
        packed = float(model(input_ids=torch.tensor(one), labels=torch.tensor(one)).loss)
    assert abs(got - packed) > 1e-3  # the plain packed loss is another number
    # blocks of 12 cut the second document: each block scores its pieces on their own
    two = pack_token_lists(docs, 12, eos).tolist()
    assert two == [docs[0] + [eos] + docs[1][:4], docs[1][4:] + [eos] + docs[2] + [eos]]
    per_block = [_per_document_reference(model, pieces, pre)
                 for pieces in ([docs[0], docs[1][:4]], [docs[1][4:], docs[2]])]
    want = [t / k for t, k in per_block]
    assert lm_block_losses(model, two, eos, batch_size=1, prefix_id=prefix) == pytest.approx(want, abs=1e-6)
    sc = document_block_scores(model, two, eos, batch_size=2, prefix_id=prefix)
    assert sc.targets == [6 + 3, 8]  # the lone token of the second document in block 2 is no target
    assert sc.loss() == pytest.approx(sum(t for t, _ in per_block) / sum(k for _, k in per_block), abs=1e-6)


def test_a_tokenizer_that_puts_bos_first_gives_its_prefix():
    tok = tiny_tokenizer()
    assert prefix_id_of(tok) == tok.bos_token_id == 1
    assert prefix_id_of(SimpleNamespace(bos_token_id=None)) is None
    no_bos_first = type("T", (), {"bos_token_id": 5, "__call__": lambda self, text: {"input_ids": [7]}})()
    assert prefix_id_of(no_bos_first) is None  # it has a BOS but does not put it before a text


def test_an_evaluation_record_from_before_the_rule_is_not_reused():
    from raycpt.jobs.base_row import CACHE_VERSION
    from raycpt.train.driver.final_eval import current_definition
    from raycpt.train.worker.evaluation import EvalRequest

    with_blocks = EvalRequest(out_dir="x", name="t", heldout_path="heldout.json")
    assert not current_definition({"heldout_loss": 4.53}, with_blocks)  # written by the packed definition
    assert current_definition({"heldout_loss": 4.65, "loss_definition": "per-document"}, with_blocks)
    assert current_definition({"questions": {}}, EvalRequest(out_dir="x", name="t"))  # no loss in it: any record
    assert CACHE_VERSION >= 3  # the base row's cache key changed with the definition


@pytest.mark.parametrize("budget", [1, 12, 64, 4096])
def test_the_forward_budget_changes_speed_not_the_loss(budget):
    """``eval.loss_batch_tokens``: any number of runs per forward (one at a time up to all at once) gives the
    per-document reference's losses (right padding after a run changes nothing before it)."""
    model = tiny_model("llama", num_layers=2)
    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(4, 128, (n,), generator=g).tolist() for n in (7, 5, 9, 3, 11, 6)]
    blocks = pack_token_lists(docs, 12, 2).tolist()
    per_run = document_block_scores(model, blocks, 2, batch_size=1, budget_tokens=1)  # one run per forward
    got = document_block_scores(model, blocks, 2, batch_size=1, budget_tokens=budget)
    assert got.targets == per_run.targets and got.losses == pytest.approx(per_run.losses, abs=1e-6)
