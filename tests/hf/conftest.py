"""Tiny random Gemma 3n / Gemma 4 checkpoints saved the way Hugging Face saves them, with a trained tokenizer.

`make_gemma(family, ...)` builds one with transformers, optionally plants a case (PLE gate weights zero:
dead; trained on text with the main embedding zeroed and frozen, so only PLE knows which token is which:
alive), and saves config.json + model.safetensors + tokenizer.json into a fresh folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity_helpers import randomise_

pytest.importorskip("transformers")
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()

V, H, L, DP = 320, 32, 2, 8
PROSE = ("The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun. "
         "A little bird sings a song about the river and the mountain, and the wind answers. ")
CODE = ("def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n"
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n")


def _config(family: str, ple_vocab: int, tie: bool):
    common = dict(vocab_size=V, vocab_size_per_layer_input=ple_vocab, hidden_size=H, hidden_size_per_layer_input=DP,
                  num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                  layer_types=["full_attention"] * L, max_position_embeddings=128, intermediate_size=64,
                  tie_word_embeddings=tie)
    if family == "gemma3n":
        from transformers import Gemma3nTextConfig

        return Gemma3nTextConfig(**common, laurel_rank=4, altup_num_inputs=2, num_kv_shared_layers=0,
                                 activation_sparsity_pattern=[0.0] * L)
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(**common, global_head_dim=16)


def _train_only_ple_knows_tokens(lm: torch.nn.Module, tokens: torch.Tensor, steps: int) -> None:
    """Give every token the same main-embedding row (frozen), then fit next-token prediction: token identity
    reaches the model only through the PLE table, so every PLE ablation must cost loss. (Not zero rows: the
    gate multiplies the PLE vector by act(W h), which would stay zero.)"""
    emb = lm.model.embed_tokens.weight
    with torch.no_grad():
        emb.copy_(emb[0].expand_as(emb))
    emb.requires_grad_(False)
    params = [p for p in lm.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    g = torch.Generator().manual_seed(0)
    lm.train()
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - 33, (8,), generator=g)
        batch = torch.stack([tokens[s : s + 33] for s in starts])
        logits = lm(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    lm.eval()


@pytest.fixture(scope="session")
def gemma_vocab() -> int:
    """Vocabulary size of the tiny models (and rows of their PLE table unless a test asks otherwise)."""
    return V


@pytest.fixture(scope="session")
def tokenizer_json() -> str:
    from plelab.data.tokenizer import Tokenizer

    tok = Tokenizer.train_bpe([PROSE * 20, CODE * 20], V - 20, min_frequency=1)
    assert tok.vocab_size <= V
    return tok.to_json()


@pytest.fixture(scope="session")
def valid_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("valid")
    (d / "prose.txt").write_text(PROSE * 30, encoding="utf-8")
    (d / "code.txt").write_text(CODE * 30, encoding="utf-8")
    return d


@pytest.fixture(scope="session")
def make_gemma(tmp_path_factory, tokenizer_json, valid_dir):
    """make_gemma(family, plant=None|'dead'|'alive', multimodal=False, ple_vocab=V) -> saved folder."""
    from plelab.data.tokenizer import Tokenizer

    cache: dict = {}

    def make(family: str, plant: str | None = None, multimodal: bool = False, ple_vocab: int = V) -> Path:
        key = (family, plant, multimodal, ple_vocab)
        if key in cache:
            return cache[key]
        from transformers import Gemma3nForCausalLM, Gemma4ForCausalLM

        torch.manual_seed(0)
        cls = Gemma3nForCausalLM if family == "gemma3n" else Gemma4ForCausalLM
        lm = cls(_config(family, ple_vocab, tie=plant != "alive")).eval()
        randomise_(lm, seed=1, layer_scalars=False)
        if plant == "dead":
            with torch.no_grad():
                for layer in lm.model.layers:
                    layer.per_layer_input_gate.weight.zero_()
        elif plant == "alive":
            tok = Tokenizer.from_json(tokenizer_json)
            text = (valid_dir / "prose.txt").read_text() + (valid_dir / "code.txt").read_text()
            _train_only_ple_knows_tokens(lm, torch.tensor(tok.encode(text)), steps=150)
        out = tmp_path_factory.mktemp(f"{family}-{plant}-{'mm' if multimodal else 'text'}")
        lm.save_pretrained(out)
        if multimodal:
            _as_multimodal(out, family)
        (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        cache[key] = out
        return out

    return make


def _as_multimodal(folder: Path, family: str) -> None:
    """Rewrite a text-only save into the published multimodal layout: model.language_model.* and text_config."""
    import json

    from safetensors.torch import load_file, save_file

    sd = load_file(str(folder / "model.safetensors"))
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in sd.items()},
              str(folder / "model.safetensors"))
    text = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": family, "text_config": text}))


def domain_documents(seed: int, count: int) -> list[str]:
    """Documents of one made-up domain: random sequences of PROSE's words (a seed per split)."""
    import random

    words = PROSE.replace(".", "").replace(",", "").lower().split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) + "." for _ in range(count)]


@pytest.fixture(scope="session")
def finetune_data(tmp_path_factory, tokenizer_json) -> tuple[Path, Path]:
    """(prepared training data of the 'prose' domain, evaluation folder with held-out prose + code), both
    tokenized with the tiny checkpoints' tokenizer."""
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import EOT, Tokenizer

    root = tmp_path_factory.mktemp("finetune-data")
    (root / "train.txt").write_text(f"\n{EOT}\n".join(domain_documents(0, 300)), encoding="utf-8")
    prepare_dataset([root / "train.txt"], Tokenizer.from_json(tokenizer_json), root / "data", val_fraction=0.1,
                    progress=False)
    valid = root / "valid"
    valid.mkdir()
    (valid / "prose.txt").write_text(f"\n{EOT}\n".join(domain_documents(1, 20)), encoding="utf-8")
    (valid / "code.txt").write_text(CODE * 10, encoding="utf-8")
    return root / "data", valid
