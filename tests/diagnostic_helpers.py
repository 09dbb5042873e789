"""The diagnostics tests' tiny PLE models and the synthetic task they train on (the fixtures are in
tests/diagnostics/conftest.py).

Task: a Markov chain over V tokens with x[t+1] = f(x[t]) (f a fixed random permutation) 90 % of the time and a
uniform random token otherwise. Predicting f(x) needs an arbitrary token -> direction lookup; a 16-wide trunk
with tied embeddings learns that slowly, while each layer's PLE row is exactly such a lookup. Known-dead
variants get the same training: PLE fed random ids unrelated to the tokens, or a gate frozen closed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from plelab.model.config import FFNConfig, ModelConfig, PLEConfig
from plelab.model.transformer import LanguageModel

VOCAB = 256
SEQ = 32
BATCH = 32
STEPS = 200
PERMUTATION = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(123))


def chain_batch(seed: int, batch: int = BATCH, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) from the synthetic chain, deterministic in `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(batch, seq + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
    for t in range(seq):
        noise = torch.randint(0, VOCAB, (batch,), generator=g)
        keep = torch.rand(batch, generator=g) < 0.9
        x[:, t + 1] = torch.where(keep, PERMUTATION[x[:, t]], noise)
    return x[:, :-1], x[:, 1:]


def tiny_config(**ple) -> ModelConfig:
    """The test model: H=16, 2 layers, dP=16 on both, no context path (so PLE sees only its ids)."""
    ple = {"dim": 16, "context": False, **ple}
    return ModelConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, max_seq_len=SEQ,
                       ffn=FFNConfig(intermediate_size=16), ple=PLEConfig(**ple))


def random_ple_ids(model: LanguageModel, seed: int = 7) -> None:
    """Feed the PLE table ids unrelated to the tokens (a pre-hook on the PLE front end)."""
    g = torch.Generator().manual_seed(seed)

    def pre(module, args):
        ids, embeds = args
        return torch.randint(0, VOCAB, ids.shape, generator=g), embeds

    model.per_layer_inputs.register_forward_pre_hook(pre)


def freeze_gate_closed(model: LanguageModel) -> None:
    """Scalar gates fixed at exactly 0: PLE can never send a signal, and gets no gradient to learn one."""
    for layer in model.layers:
        layer.ple.gate.data.zero_()
        layer.ple.gate.requires_grad_(False)


def train(cfg: ModelConfig, steps: int = STEPS, setup: Callable | None = None, seed: int = 0,
          on_step: Callable | None = None) -> LanguageModel:
    """AdamW on the chain task; `setup(model)` modifies the model first, `on_step(model, step)` runs after each."""
    # Ops this small run fastest on one thread, above all on a CPU shared with other jobs.
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = LanguageModel(cfg)
    if setup is not None:
        setup(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    for step in range(steps):
        x, y = chain_batch(1000 + step)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(model, step)
    return model.eval()


PROSE = "Per-layer embeddings give every layer its own small vector per token. A dead zone changes nothing. "
"""The byte-level corpus of the diagnose tests that train real runs."""


def byte_corpus(root, valid_repeats: int = 4) -> None:
    """ROOT/data (40 short documents of PROSE, prepared with the byte tokenizer, 10 % held out) and ROOT/valid
    (one domain file of PROSE): what a tiny run trains and is diagnosed on."""
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import Tokenizer

    src = root / "corpus.txt"
    src.write_text("\n<|endoftext|>\n".join(f"Doc {i}. " + PROSE * (1 + i % 3) for i in range(40)) + "\n")
    prepare_dataset([src], Tokenizer.byte_level(), root / "data", val_fraction=0.1, progress=False)
    (root / "valid").mkdir()
    (root / "valid" / "prose.txt").write_text(PROSE * valid_repeats + "\n")
