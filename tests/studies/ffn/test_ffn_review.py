"""The FFN study's committed first-round report recomputed under the current rules: each correction the review
made to the write-up, checked on the committed file itself (each of these read the other way under the old code)."""

from __future__ import annotations

import pytest
from sweep_helpers import STUDIES

from plelab.studies.ffn.review import ffn_review


@pytest.fixture(scope="module")
def ffn():
    return ffn_review((STUDIES / "ffn" / "ffn-study" / "report.md").read_text())


def test_ffn_mglu_gap_did_open(ffn):
    """Old: 'MGLU's gap never opened'. At 81.9k tokens it is -0.0504 +- 0.0102 (t = -4.9): open by the rule."""
    first = ffn["first_open"]["mglu1"]
    assert first["tokens"] == "81.9k" and first["t"] == pytest.approx(-4.94, abs=0.01) and first["p"] < 0.05


def test_ffn_moe_is_measurably_worse_alone_and_not_after_holm(ffn):
    """Old: 'no FFN variant with the same bytes can be measurably worse' and MoE 'no difference'."""
    moe = ffn["val"]["moe"]
    assert moe["outcome_alone"] == "worse" and moe["ci95"][0] > 0        # significant on its own
    assert moe["p_holm"] > 0.05 and moe["outcome"] == "not resolved"     # not once the six variants are a family
    assert ffn["macro"]["moe"]["outcome_alone"] == "not resolved"       # the macro: not resolved, never "no difference"
    assert ffn["domain_counts"]["moe"]["old_sign_test_p"] < 1e-4        # what the invalid domain sign test said
    assert ffn["domain_counts"]["moe"]["worse_holm"] == 0


def test_ffn_pruned_is_not_cheaper_than_narrow_and_mglu_is_not_resolved(ffn):
    """Old: 'pruned <= narrow' and 'MGLU not reproduced'."""
    for metric in ("val", "macro"):
        assert ffn[metric]["swiglu_narrow"]["mean"] < ffn[metric]["pruned"]["mean"]
    mglu = ffn["val"]["mglu1"]
    assert mglu["ci95"][0] < 0 < 0.041 < mglu["ci95"][1]                # 0 and the published +0.041 both inside
    narrow = ffn["val"]["swiglu_narrow"]                                 # 'the narrow equals the full one'
    assert narrow["outcome"] == "not resolved" and narrow["ci95"][1] - narrow["ci95"][0] > 0.35
