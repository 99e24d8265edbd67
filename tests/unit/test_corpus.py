"""Corpus pieces without Ray: packing against hand examples, the seeded shuffle, readers, the asset."""

import gzip
import json

import numpy as np
import pytest

from raycpt.data.corpus import (GLOSSES, block_keys, fortunes_documents, iter_documents, local_blocks,
                                pack_token_lists, shuffle_order)
from raycpt.errors import RaycptError
from tiny import tiny_tokenizer


def test_pack_with_eos_hand_example():
    docs = [[1, 2, 3], [4, 5], [6]]
    # stream: 1 2 3 E 4 5 E 6 E  (E = 9)
    np.testing.assert_array_equal(pack_token_lists(docs, 3, 9), [[1, 2, 3], [9, 4, 5], [9, 6, 9]])
    np.testing.assert_array_equal(pack_token_lists(docs, 4, 9), [[1, 2, 3, 9], [4, 5, 9, 6]])  # tail "9" dropped
    assert pack_token_lists(docs, 10, 9).shape == (0, 10)
    assert pack_token_lists([], 4, 9).shape == (0, 4)
    assert pack_token_lists(docs, 3, 9).dtype == np.int32


def test_shuffle_is_seeded_and_content_keyed():
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 1000, size=(50, 8)).astype(np.int32)
    a = blocks[shuffle_order(blocks, seed=1)]
    b = blocks[shuffle_order(blocks, seed=1)]
    np.testing.assert_array_equal(a, b)
    # the order depends only on the seed and the contents, not on the input order
    perm = rng.permutation(50)
    np.testing.assert_array_equal(blocks[perm][shuffle_order(blocks[perm], seed=1)], a)
    c = blocks[shuffle_order(blocks, seed=2)]
    assert not np.array_equal(a, c)
    assert sorted(map(bytes, a)) == sorted(map(bytes, blocks))  # a permutation
    # naive reference for the key: blake2b(seed as 8 little-endian bytes + int32 tokens), first 8 bytes
    import hashlib

    row = blocks[0]
    want = int.from_bytes(hashlib.blake2b((1).to_bytes(8, "little") + row.astype("<i4").tobytes(),
                                          digest_size=8).digest(), "little")
    assert int(block_keys(blocks[:1], 1)[0]) == want


def test_readers(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "first doc"}) + "\n\n" + json.dumps({"body": "second"}) + "\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "third"}) + "\n")
    (tmp_path / "c.txt").write_text("line one\n\nline two\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["pq doc"]}), tmp_path / "d.parquet")
    docs = list(iter_documents([str(tmp_path / "*.jsonl*"), str(tmp_path / "d.parquet")], text_field="body"))
    assert docs == ["first doc", "second", "third", "pq doc"]
    assert list(iter_documents([str(tmp_path / "c.txt")])) == ["line one", "line two"]
    assert list(iter_documents([str(tmp_path / "a.jsonl")], "body", max_documents=1)) == ["first doc"]
    with pytest.raises(RaycptError, match="no field 'text'"):
        list(iter_documents([str(tmp_path / "a.jsonl")]))
    with pytest.raises(RaycptError, match="matches no file"):
        list(iter_documents([str(tmp_path / "missing.jsonl")]))
    with pytest.raises(RaycptError, match="unknown source"):
        list(iter_documents(["builtin:nope"]))


def test_hub_source_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RaycptError) as e:
        list(iter_documents(["hf:someone/some-corpus"]))
    assert "needs the Hugging Face hub" in str(e.value) and "\n" not in str(e.value)


def test_fortunes_parser_strips_colour_codes(tmp_path):
    # synthetic entries in the fortune file format (the real GPL text is only read at run time)
    (tmp_path / "chinese").write_text("第一条\n\n\x1b[33m    -- 作者\x1b[m\n%\n第二条\n%\n")
    docs = fortunes_documents(tmp_path, files=("chinese", "absent"))
    assert docs == ["第一条\n\n    -- 作者", "第二条"]
    with pytest.raises(RaycptError, match="fortunes-zh"):
        fortunes_documents(tmp_path / "nowhere")


def test_shipped_glosses_asset():
    assert GLOSSES.is_file() and GLOSSES.stat().st_size < 3_000_000
    assert (GLOSSES.parent / "WORDNET_LICENSE.txt").is_file()
    docs = list(iter_documents(["builtin:wordnet-glosses"], max_documents=200))
    assert len(docs) == 200 and all("(noun): " in d or "(verb): " in d or "(adjective): " in d or "(adverb): " in d
                                    for d in docs)


def test_local_blocks_hold_every_document_token_in_order():
    tok = tiny_tokenizer()
    docs = list(iter_documents(["builtin:wordnet-glosses"], max_documents=30))
    blocks = local_blocks(["builtin:wordnet-glosses"], tok, seq_len=16, seed=0, max_documents=30)
    eos = tok.eos_token_id
    stream = []
    for d in docs:
        stream += tok(d, add_special_tokens=False)["input_ids"] + [eos]
    n = len(stream) // 16
    want = np.array(stream[: n * 16]).reshape(n, 16)
    assert blocks.shape == want.shape
    assert sorted(map(bytes, blocks.astype(np.int32))) == sorted(map(bytes, want.astype(np.int32)))
    np.testing.assert_array_equal(blocks, want[shuffle_order(want.astype(np.int32), 0)])
