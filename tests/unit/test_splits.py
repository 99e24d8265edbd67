"""The split rule: b = floor(r*N + 1/2), half up, with exact fractions (004 Table 9: 28 layers -> 9, 14, 19)."""

from __future__ import annotations

import math

import pytest

from raycpt.config import load_config
from raycpt.errors import ConfigError
from raycpt.splits import check_split, parse_ratio, split_index


@pytest.mark.parametrize("text, b", [("1/3", 9), ("1/2", 14), ("2/3", 19)])
def test_paper_table_9_boundaries_on_28_layers(text, b):
    # 004 Table 9 (Qwen3, 28 layers): 1/3 -> 9 (28/3 = 9.33), 1/2 -> 14, 2/3 -> 19 (18.67)
    assert split_index(parse_ratio(text), 28) == b
    assert check_split(parse_ratio(text), 28) == b


def test_half_up_not_half_to_even():
    # Python's round(2.5) = 2 and round(0.5 * 5) = 2: the rule is floor(x + 1/2) -> 3
    assert round(0.5 * 5) == 2
    assert split_index(0.5, 5) == 3
    assert split_index(0.5, 7) == 4
    assert split_index(0.5, 9) == 5  # 4.5 -> 5 (round gives 4)
    # decimals land on their exact half: 0.35 * 10 = 3.5 -> 4 (the binary float 0.35 is a hair below)
    assert split_index(0.35, 10) == 4 and split_index(0.25, 10) == 3  # 2.5 -> 3
    # the old default 0.66 is not 2/3: 18.48 -> 18 on 28 layers
    assert split_index(0.66, 28) == 18 and split_index(2 / 3, 28) == 19


def test_parse_ratio_reads_decimals_and_fractions_and_rejects_the_rest():
    assert parse_ratio("0.66") == 0.66 and parse_ratio(" 2/3 ") == pytest.approx(2 / 3)
    for bad in ("x", "1/0", "a/3", ""):
        with pytest.raises(ValueError):
            parse_ratio(bad)


def test_config_and_cli_accept_fractions(tmp_path):
    import yaml

    from raycpt.usage import floats

    # the CLI's --splits converter (an override value, read back as YAML by the config loader)
    assert yaml.safe_load(floats("--splits")("1/3,1/2,2/3")) == pytest.approx([1 / 3, 0.5, 2 / 3])
    assert [split_index(r, 28) for r in yaml.safe_load(floats("--splits")("1/3,1/2,2/3"))] == [9, 14, 19]
    cfg = load_config(None, ["sweep.splits=1/3,1/2,2/3"])
    assert [split_index(r, 28) for r in cfg.sweep.splits] == [9, 14, 19]
    qwen = load_config("configs/qwen3-0.6b.yaml")
    assert [split_index(r, 28) for r in qwen.sweep.splits] == [9, 14, 19]
    assert math.isclose(qwen.trace.splits[2], 2 / 3)
    with pytest.raises(ConfigError):
        load_config(None, ["sweep.splits=1/x"])


def test_the_rule_is_worded_one_way_wherever_it_is_printed():
    """The plans print the rule with its numbers (worked by hand: 0.5 of 5 layers, 2/3 of 28); no config, doc
    or module words it as Python's ``round`` (half to even), which gives 2 layers where the rule gives 3."""
    import re
    from pathlib import Path

    from raycpt.splits import RULE, rule_line

    assert RULE == "b = floor(r*N + 1/2)"
    assert rule_line(0.5, 5) == "b = floor(0.5*5 + 1/2) = 3"
    assert rule_line(2 / 3, 28) == "b = floor(0.666667*28 + 1/2) = 19"
    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("raycpt/**/*.py"), *root.glob("docs/*.md"), *root.glob("configs/*.yaml"), root / "README.md"]
    wrong = [f"{f.relative_to(root)}: {m.group(0)}" for f in files
             for m in re.finditer(r"b = round\(|round\(r[ *·]|round\(rN\)", f.read_text(encoding="utf-8"))]
    assert wrong == []
