"""Prompt files: context/query positions from offsets, and every bad input named by line number."""

import json
from collections import Counter

import pytest
import transformers as T

from raycpt.diagnostics.prompts import PromptRecord, collate, encode_prompt, encode_prompts, load_prompt_records
from raycpt.errors import RaycptError
from tiny import tiny_tokenizer


def word_tokenizer():
    """A word-level fast tokenizer (whitespace + punctuation pre-splitting, BOS added, offsets)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<pad>", "<s>", "</s>", "<unk>", "Example", "Exam", "ple", ":", "hot", "->", "Cold", ";", "Query",
             "fast", ",", "big", "Small", "Q"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Punctuation(behavior="contiguous")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>")


def write(tmp_path, lines, name="p.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return str(p)


GOOD = json.dumps({"s1": "Example: hot->Cold;", "s2": " Query: fast->", "group": "ant", "answer": "Slow"})


def test_positions_char_tokenizer():
    rec = PromptRecord("ab;", " c->", "g")
    e = encode_prompt(rec, tiny_tokenizer())
    # <s> a b ; ␣ c - >   : BOS (position 0) is in neither set and never masked
    assert len(e.input_ids) == 8
    assert e.context == [1, 2, 3]
    assert e.query == [4, 5, 6, 7]
    assert e.last == 7


def test_positions_word_tokenizer_drops_trailing_eos():
    tok = word_tokenizer()
    e = encode_prompt(PromptRecord("Example: hot->Cold;", " Query: fast->", "g"), tok)
    pieces = tok.convert_ids_to_tokens(e.input_ids)
    assert pieces == ["<s>", "Example", ":", "hot", "->", "Cold", ";", "Query", ":", "fast", "->"]  # no </s>
    assert e.context == [1, 2, 3, 4, 5, 6] and e.query == [7, 8, 9, 10] and e.last == 10


def test_collate_right_pads_and_marks_context():
    tok = tiny_tokenizer()
    enc = encode_prompts([PromptRecord("ab;", " c->", "g"), PromptRecord("abcd;", " e->", "g")], tok)
    b = collate(enc, pad_id=0)
    assert b["input_ids"].shape == (2, 10)
    assert b["attention_mask"][0].tolist() == [1] * 8 + [0, 0]
    assert b["context_mask"][0].tolist() == [False, True, True, True] + [False] * 6
    assert b["last"].tolist() == [7, 9]


def test_boundary_inside_token_names_line(tmp_path):
    path = write(tmp_path, [GOOD, json.dumps({"s1": "Exam", "s2": "ple: hot->", "group": "g"})])
    recs = load_prompt_records(path)
    with pytest.raises(RaycptError, match=r"line 2: the s1/s2 boundary \(character 4\) falls inside token 'Example'"):
        encode_prompts(recs, word_tokenizer())


def test_answer_first_token():
    e = encode_prompt(PromptRecord("Example: hot->Cold;", " Query: big->", "g", answer="Small"), word_tokenizer())
    assert e.answer_id == 16


@pytest.mark.parametrize("line,msg", [
    ("{not json", r"line 2 is not JSON"),
    ('["s1", "s2"]', r"line 2 is not a JSON object"),
    ('{"s1": "a;", "group": "g"}', r"line 2 lacks s2 \(each line needs s1, s2, group\)"),
    ('{"s1": "a;"}', r"line 2 lacks s2, group"),
    ('{"s1": "", "s2": " q->", "group": "g"}', r"line 2: s1 is empty"),
    ('{"s1": "a;", "s2": "  ", "group": "g"}', r"line 2: s2 is empty"),
    ('{"s1": "a;", "s2": " q->", "group": 3}', r"line 2: field group must be a string"),
])
def test_bad_records_name_the_line(tmp_path, line, msg):
    path = write(tmp_path, [GOOD, line, GOOD])
    with pytest.raises(RaycptError, match=msg):
        load_prompt_records(path)


def test_blank_lines_keep_line_numbers(tmp_path):
    path = write(tmp_path, [GOOD, "", "  ", "{bad"])
    with pytest.raises(RaycptError, match="line 4"):
        load_prompt_records(path)


@pytest.mark.parametrize("lines", [[], ["", "   "]])
def test_empty_file(tmp_path, lines):
    path = write(tmp_path, lines)
    with pytest.raises(RaycptError, match="is empty"):
        load_prompt_records(path)


def test_missing_file_and_unknown_builtin(tmp_path):
    with pytest.raises(RaycptError, match="prompt file not found"):
        load_prompt_records(str(tmp_path / "nope.jsonl"))
    with pytest.raises(RaycptError, match="unknown built-in prompt set"):
        load_prompt_records("builtin:nope")


def test_error_messages_are_one_line(tmp_path):
    path = write(tmp_path, ['{"s1": "a\\nb", "s2": "", "group": "g"}'])
    with pytest.raises(RaycptError) as e:
        load_prompt_records(path)
    assert "\n" not in str(e.value)


def test_any_language(tmp_path):
    path = write(tmp_path, [json.dumps({"s1": "例：热→冷；", "s2": "问：大→", "group": "zh"}, ensure_ascii=False)])
    rec = load_prompt_records(path)[0]
    e = encode_prompt(rec, tiny_tokenizer())
    assert len(e.context) == 6 and len(e.query) == 4  # one token per character, BOS in neither


def test_builtin_wordnet_set():
    recs = load_prompt_records("builtin:wordnet-lexical")
    assert len(recs) == 500
    counts = Counter(r.group for r in recs)
    assert len(counts) == 10 and set(counts.values()) == {50}
    for r in recs:
        assert r.s1.startswith("Example: ") and r.s1.endswith(";")
        assert r.s2.startswith(" Query: ") and r.s2.endswith("->")
        assert r.answer and r.answer[0].isupper()
    # the template's boundary is a token boundary for a word-splitting tokenizer as well
    encode_prompts(recs[:20], tiny_tokenizer())


def space_joining_tokenizer():
    """Word-level, but a space joins the FOLLOWING word (as byte-level BPE does: ``Ġ`` + word), with BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<pad>", "<s>", "</s>", "<unk>", "Example", ":", "Ġhot", "->", "Cold", ";", "ĠQuery", "Query", "Ġbig",
             "ho", "t"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>")


def test_trailing_space_of_s1_goes_with_s2():
    tok = space_joining_tokenizer()
    # tokens: <s> Example : Ġhot -> Cold ; ĠQuery : Ġbig ->   (ĠQuery = characters 19-25, s1 ends at 20)
    e = encode_prompt(PromptRecord("Example: hot->Cold; ", "Query: big->", "g"), tok)
    pieces = tok.convert_ids_to_tokens(e.input_ids)
    assert pieces == ["<s>", "Example", ":", "Ġhot", "->", "Cold", ";", "ĠQuery", ":", "Ġbig", "->"]
    assert e.context == [1, 2, 3, 4, 5, 6] and e.query == [7, 8, 9, 10] and e.seam_space
    # the same prompt with the space written at the start of s2 gives the same split, and no seam note
    f = encode_prompt(PromptRecord("Example: hot->Cold;", " Query: big->", "g"), tok)
    assert (f.input_ids, f.context, f.query, f.seam_space) == (e.input_ids, e.context, e.query, False)


def test_seam_note_counts_once():
    from raycpt.diagnostics.prompts import seam_note

    tok = space_joining_tokenizer()
    recs = [PromptRecord("Example: hot->Cold; ", "Query: big->", "g"),
            PromptRecord("Example: hot->Cold;", " Query: big->", "g"),
            PromptRecord("Example: hot->Cold;  ", "Query: big->", "g")]
    enc = encode_prompts(recs, tok)
    assert [p.seam_space for p in enc] == [True, False, True]
    note = seam_note(enc)
    assert note.startswith("2 of 3 prompt(s):") and "s2 (query) side" in note and "\n" not in note
    assert seam_note(enc[1:2]) is None


def test_token_straddling_real_characters_still_refused():
    tok = space_joining_tokenizer()
    with pytest.raises(RaycptError, match=r"falls inside token ' hot'"):  # " ho" + "t": a space AND a letter in s1
        encode_prompt(PromptRecord("Example: ho", "t->Cold; Query: big->", "g"), tok)


def test_a_repeated_prompt_is_refused_naming_both_lines_and_a_small_set_is_warned(tmp_path):
    """Issue 27: four copies of one prompt gave `S(b) on 4 prompts` with a zero-width interval and no word."""
    import json as _json

    from raycpt.diagnostics.prompts import MIN_INTERVAL_PROMPTS, check_prompt_set, load_prompt_records
    from raycpt.errors import RaycptError as _Err

    rec = {"s1": "Example: hot->cold; Query: up->", "s2": "down", "group": "antonym"}
    other = {**rec, "s2": "low"}
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(_json.dumps(r) for r in (rec, other, rec)) + "\n")
    with pytest.raises(_Err, match=r"p.jsonl line 3 repeats line 1 \(the same s1 and s2\)"):
        check_prompt_set(load_prompt_records(str(f)))
    warned = []
    f.write_text("\n".join(_json.dumps({**rec, "s2": f"w{i}"}) for i in range(MIN_INTERVAL_PROMPTS - 1)) + "\n")
    check_prompt_set(load_prompt_records(str(f)), warn=warned.append)
    assert len(warned) == 1 and f"S(b) on {MIN_INTERVAL_PROMPTS - 1} prompts" in warned[0]
    f.write_text("\n".join(_json.dumps({**rec, "s2": f"w{i}"}) for i in range(MIN_INTERVAL_PROMPTS)) + "\n")
    warned.clear()
    check_prompt_set(load_prompt_records(str(f)), warn=warned.append)
    assert warned == []
