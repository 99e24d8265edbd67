"""The answer letter in a generated text (the ``generate`` protocol's extraction, :func:`extract_choice`)."""

from __future__ import annotations

import re
import unicodedata
from typing import Optional

LETTERS = ("A", "B", "C", "D")


# An explicit answer statement ("answer is (D)", "答案：C", "选项B") wins; otherwise the first
# standalone capital A-D (not glued to other Latin letters, so "The", "AB", "DNA" give nothing).
_CUE = re.compile(r"(?:(?i:answer)|答案|选项|选择|应选|选)\s*(?:(?i:is|was|would be|should be)|是|为|应该是|应为)?"
                  r"\s*[:]?\s*[(\[]?\s*([A-D])(?![A-Za-z])")
_STANDALONE = re.compile(r"(?<![A-Za-z])([A-D])(?![A-Za-z])")


def extract_choice(text: Optional[str]) -> Optional[str]:
    """The answer letter (A-D) in a generated text, or None.

    Rules, in order: the text is NFKC-normalised (full-width ``Ｂ``, ``：``, ``（`` become ASCII);
    an explicit answer cue (``answer is``, ``Answer:``, ``答案``, ``答案是``, ``选``) followed by a
    letter wins; otherwise the **first standalone** capital A-D counts (``" B."`` -> B,
    ``"A or B"`` -> A); letters glued to other Latin letters never count (``"AB"`` -> None,
    ``"The"`` -> None); lower-case a-d never count. Empty or None -> None.
    """
    if not text:
        return None
    t = unicodedata.normalize("NFKC", text)
    m = _CUE.search(t)
    if m:
        return m.group(1)
    m = _STANDALONE.search(t)
    return m.group(1) if m else None
