"""Fixtures for the diagnostics tests: tiny PLE models trained on the synthetic chain task of
tests/diagnostic_helpers.py, one working and two known-dead (random PLE ids, a gate frozen closed)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from diagnostic_helpers import chain_batch, freeze_gate_closed, random_ple_ids, tiny_config, train

from plelab.model.transformer import LanguageModel


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def make_model() -> Callable[..., LanguageModel]:
    """Factory for an untrained test model: make_model(gate="scalar", ...) sets PLE options."""

    def make(seed: int = 0, **ple) -> LanguageModel:
        torch.manual_seed(seed)
        return LanguageModel(tiny_config(**ple))

    return make


@pytest.fixture
def chain():
    """The synthetic chain's batch function, chain(seed, batch, seq) -> (x, y)."""
    return chain_batch


@pytest.fixture(scope="session")
def eval_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Held-out batches of the chain task (seeds disjoint from training)."""
    return [chain_batch(10**6 + i) for i in range(4)]


@pytest.fixture(scope="session")
def working_model() -> LanguageModel:
    """PLE that carries the lookup: must be judged alive."""
    t0 = time.perf_counter()
    model = train(tiny_config())
    model.train_seconds = time.perf_counter() - t0
    return model


@pytest.fixture(scope="session")
def random_ids_model() -> LanguageModel:
    """PLE fed random ids: trained the same way, must be judged dead."""
    return train(tiny_config(), setup=random_ple_ids)


@pytest.fixture(scope="session")
def closed_gate_model() -> LanguageModel:
    """Simple-form PLE with its scalar gate frozen at 0: must be judged dead."""
    return train(tiny_config(gate="scalar", output_norm=False), steps=60, setup=freeze_gate_closed)
