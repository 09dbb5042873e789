"""Table-health metrics: exact formulas, random baselines, the two views and which rows they use."""

from __future__ import annotations

import math

import numpy as np
import torch

from plelab.diagnostics.batches import token_frequencies, top_tokens
from plelab.diagnostics.table_health import (
    compare_to_random,
    effective_rank,
    empirical_baseline,
    mean_pairwise_cosine,
    pc1_explained_variance,
    table_health,
    theory_baseline,
)


def test_mean_cosine_matches_brute_force():
    m = torch.randn(50, 8, generator=torch.Generator().manual_seed(1)) + 0.3
    u = m / m.norm(dim=1, keepdim=True)
    cos = (u @ u.T)[~torch.eye(50, dtype=torch.bool)]
    mean, std = mean_pairwise_cosine(m)
    assert math.isclose(mean, cos.mean().item(), abs_tol=1e-6)
    assert math.isclose(std, cos.std(unbiased=False).item(), abs_tol=1e-6)


def test_effective_rank_and_pc1_on_known_matrices():
    eye = torch.eye(6)
    assert math.isclose(effective_rank(eye), 6.0, rel_tol=1e-9)  # equal singular values: entropy log 6
    rank1 = torch.randn(40, 1) @ torch.randn(1, 10)
    assert effective_rank(rank1) < 1.01
    assert math.isclose(pc1_explained_variance(rank1), 1.0, rel_tol=1e-6)


def test_gaussian_matches_theory_and_is_random_like():
    n, d = 1024, 32
    emp, th = empirical_baseline(n, d), theory_baseline(n, d)
    assert abs(emp["effective_rank"] - th["effective_rank"]) < 0.05 * d
    assert abs(emp["pc1_explained_variance"] - th["pc1_explained_variance"]) < 0.2 * th["pc1_explained_variance"]
    assert abs(emp["cosine_std"] - th["cosine_std"]) < 0.01
    assert abs(emp["mean_cosine"]) < 0.01
    other = torch.randn(n, d, generator=torch.Generator().manual_seed(5))
    assert compare_to_random(other)["random_like"] is True


def test_structured_matrix_is_not_random_like():
    g = torch.Generator().manual_seed(2)
    low_rank = torch.randn(500, 3, generator=g) @ torch.randn(3, 32, generator=g)
    verdict = compare_to_random(low_rank + 0.01 * torch.randn(500, 32, generator=g))
    assert verdict["random_like"] is False


def test_frequencies_map_out_of_vocab_ids_to_row_0():
    counts = token_frequencies(np.array([5, 5, 5, 2, 99, -3]), num_rows=10)
    assert counts[5] == 3 and counts[0] == 2 and counts[2] == 1
    assert top_tokens(counts, 2).tolist() == [5, 0]
    assert top_tokens(counts, 10).tolist() == [5, 0, 2]  # ids that never occur are not picked


def test_views_say_which_rows_and_when_init_is_missing(make_model):
    model = make_model()
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    init = table.detach().clone().numpy()
    ids = np.repeat(np.arange(20), 3)
    no_init = table_health(model, ids, None, top_k=8, init_note="not recorded")
    assert "8 most frequent" in no_init["views"]["frequent"]["rows"]
    assert no_init["views"]["delta"] == {"available": False, "rows": None, "reason": "not recorded"}
    with torch.no_grad():
        table[:30] += torch.randn(30, table.shape[1])
    both = table_health(model, None, init, top_k=16)
    assert "changed most since initialisation" in both["views"]["frequent"]["rows"]
    for view in both["views"].values():
        assert view["available"] and set(view["layers"]) == {0, 1}
        assert view["layers"][0]["rows"] == 16
    wrong = table_health(model, ids, init[:, :3])
    assert "shape" in wrong["views"]["delta"]["reason"]
