"""Every claim states the test its verdict applies: the expected text names a comparison and its bar.

Checked on the claims each lab's current judge makes from its newest reference run: a verdict
(holds / does not hold) must come with an expected text that says how it was decided (">= 2x",
"within 10%", "< ridge 9.5 FLOP/B", "all identical"), never a bare "~20x" the judge does not apply.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmlab.tools import readme

ROOT = Path(__file__).resolve().parents[1]
# a comparison, in symbols or words, or a band: "2-4.5x", "0.33x-1.25x"
_TEST = re.compile(r"(>=|<=|>|<|=|≥|≤|±|\+-|\bwithin\b|\bexact|\bequal|\bidentical|\bsame\b|\ball\b|\bevery\b|"
                   r"\bmatch|\bunchanged\b|\bnone\b|\bno\b|\bbelow\b|\babove\b|\bat least\b|\bat most\b|\bbeats?\b|"
                   r"\bthan\b|\d[\d.,]*\s*[a-zA-Z%]*\s*(?:-|–|to)\s*\d)", re.I)


def _verdicts() -> list[tuple[str, object]]:
    return [(run.lab, c) for run in readme.newest_runs(ROOT / readme.REFERENCE) for c in run.claims
            if c.holds is not None]


def test_the_pattern_tells_a_test_from_a_bare_estimate():
    for ok in (">= 2x", "within 10%", "< ridge 9.5 FLOP/B", "all identical (FP32)", "FMA < matmul",
               "tree > chain (greedy)", "in 4.5-18x", "0.33x-1.25x of the napkin",
               "lower ITL in chunks than in one step"):
        assert _TEST.search(ok), ok
    for bare in ("~20x (roofline)", "TTFT x18, ITL x1.13", "B ~26 (napkin ~19)"):
        assert not _TEST.search(bare), bare


@pytest.mark.parametrize("lab", sorted({lab for lab, _ in _verdicts()}))
def test_each_judged_claim_states_its_test(lab):
    bare = [f"{c.id}: {c.expected!r}" for run_lab, c in _verdicts() if run_lab == lab and not _TEST.search(c.expected)]
    assert not bare, "expected text that does not say what test the verdict applies:\n" + "\n".join(bare)
