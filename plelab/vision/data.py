"""The vision trainer's batch source: a prepared corpus's training split in seeded, resumable order, and its
held-out split for evaluation (all of it, in order).

Sampler: epoch e visits the N training images in the order of a permutation seeded by (seed, e); batch b
takes entries [b*B, (b+1)*B) (the remainder is dropped). The whole state is (epoch, batch index): restoring
it replays the exact next batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.model.transformer import check_token_ids
from plelab.util.dataclass_config import ConfigError
from plelab.vision.config import VisionConfig
from plelab.vision.model import VisionBatch, caption_targets

TRAIN_SPLIT, HELDOUT_SPLIT = "train", "valid"
SAMPLER_STATE_VERSION = 1


class CorpusSplit(Protocol):
    """What the trainer reads of one split of a prepared corpus (plelab.vision.corpus.VisionCorpus)."""

    pixels: np.ndarray  # (N, P, p*p) float32 in [0, 1]
    patch_ids: np.ndarray  # (N, P) int64 in [0, K)
    captions: np.ndarray  # (N, T) int64, right-padded
    caption_lengths: np.ndarray  # (N,)
    manifest: dict[str, Any]


def open_corpus(path: str | Path, split: str) -> CorpusSplit:
    """One split of a prepared corpus (verified on load by VisionCorpus)."""
    from plelab.vision.corpus import VisionCorpus

    return VisionCorpus.load(path, split)


def corpus_facts(corpus: CorpusSplit) -> dict[str, Any]:
    """P, p*p, K, T, caption vocabulary, the caption tokenizer file and start token (None: captions have none)
    of a split, from its arrays and manifest."""
    m = corpus.manifest
    try:
        return {"patches": corpus.patch_ids.shape[1], "patch_pixels": corpus.pixels.shape[2],
                "patch_size": int(m["patch_size"]), "codebook": int(m["codebook"]),
                "caption_len": corpus.captions.shape[1], "caption_vocab": int(m["caption_vocab_size"]),
                "tokenizer": m.get("caption_tokenizer"), "bos_id": m.get("bos_id")}
    except (KeyError, TypeError, ValueError) as exc:
        raise PlelabError(f"vision corpus manifest lacks or garbles {exc}; prepare the corpus again") from None


def check_corpus(facts: dict[str, Any], vision: VisionConfig, model: ModelConfig) -> None:
    """ConfigError (one line) where the config and the corpus disagree."""
    for name in ("codebook", "patches", "patch_size"):
        want = getattr(vision, name)
        if want is not None and want != facts[name]:
            raise ConfigError(f"vision.{name} = {want} but the corpus {vision.corpus} has {facts[name]}")
    if facts["caption_vocab"] > model.vocab_size:
        raise ConfigError(f"model.vocab_size = {model.vocab_size} is below the corpus's caption vocabulary "
                          f"({facts['caption_vocab']})")
    length = facts["patches"] + facts["caption_len"]
    if length > model.max_seq_len:
        raise ConfigError(f"model.max_seq_len = {model.max_seq_len} is below a sequence of {facts['patches']} "
                          f"patches + {facts['caption_len']} caption tokens ({length})")


def corpus_fingerprint(split: CorpusSplit) -> str:
    """sha256 identifying a corpus: of its files' checksums (its manifest) when it has them, else of its arrays."""
    import hashlib
    import json

    files = split.manifest.get("files")
    if files:
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    h = hashlib.sha256()
    for array in (split.pixels, split.patch_ids, split.captions, split.caption_lengths):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


class ImageSampler:
    """Seeded, resumable order of N images in batches of B (see the module docstring)."""

    def __init__(self, n: int, batch_size: int, seed: int):
        if n < batch_size:
            raise PlelabError(f"the vision corpus's training split has {n} images, fewer than batch_size "
                              f"{batch_size}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next_indices(self) -> np.ndarray:
        """Image indices of the next batch."""
        if self.index >= self.n // self.batch_size:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        start = self.index * self.batch_size
        self.index += 1
        return self._order[start : start + self.batch_size]

    def state_dict(self) -> dict[str, Any]:
        """Position (and what it was computed for)."""
        return {"version": SAMPLER_STATE_VERSION, "epoch": self.epoch, "index": self.index, "n": self.n,
                "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved for the same images, batch size and seed."""
        mine = self.state_dict()
        diff = [k for k in ("version", "n", "batch_size", "seed") if state.get(k) != mine[k]]
        if diff:
            raise PlelabError(f"cannot resume the image order: {', '.join(diff)} changed "
                              f"({', '.join(f'{state.get(k)} -> {mine[k]}' for k in diff)})")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)


class SplitTensors:
    """A corpus split as tensors on the training device, batched by index."""

    def __init__(self, corpus: CorpusSplit, device: torch.device, bos_id: int | None = None):
        self.bos_id = bos_id
        self.pixels = torch.as_tensor(np.asarray(corpus.pixels, dtype=np.float32), device=device)
        self.patch_ids = torch.as_tensor(np.asarray(corpus.patch_ids, dtype=np.int64), device=device)
        self.captions = torch.as_tensor(np.asarray(corpus.captions, dtype=np.int64), device=device)
        self.lengths = torch.as_tensor(np.asarray(corpus.caption_lengths, dtype=np.int64), device=device)

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def batch(self, index: torch.Tensor | slice) -> tuple[VisionBatch, torch.Tensor]:
        """(inputs, targets) of the images at `index`."""
        inputs = VisionBatch(self.pixels[index], self.patch_ids[index], self.captions[index])
        return inputs, caption_targets(inputs.captions, self.lengths[index], inputs.patch_ids.shape[1], self.bos_id)


class VisionData:
    """The batch source of a vision run: `next_batch() -> (VisionBatch, targets)`, state_dict/load_state_dict,
    the held-out split for evaluation, and the caption tokenizer file to ship with checkpoints."""

    eval_domains: dict[str, Any] = {}  # the text Evaluator finds nothing to evaluate (CaptionEvaluator does it)

    def __init__(self, cfg: Any, device: torch.device):
        vision = cfg.vision
        train = open_corpus(vision.corpus, TRAIN_SPLIT)
        heldout = open_corpus(vision.corpus, HELDOUT_SPLIT)
        self.facts = corpus_facts(train)
        check_corpus(self.facts, vision, cfg.model)
        for split in (train, heldout):
            top = int(np.max(split.patch_ids, initial=0))
            if top >= self.facts["codebook"] or int(np.min(split.patch_ids, initial=0)) < 0:
                raise PlelabError(f"vision corpus {vision.corpus}: patch ids outside [0, {self.facts['codebook']}) "
                                  "(corrupt corpus; prepare it again)")
            check_token_ids(split.captions, cfg.model.vocab_size)  # once here: the model's forward does not check
        self.corpus = vision.corpus
        self.fingerprint = corpus_fingerprint(train)
        tok = self.facts["tokenizer"]
        self.tokenizer_path = Path(vision.corpus) / tok if tok else None
        self.train = SplitTensors(train, device, self.facts["bos_id"])
        self.heldout = SplitTensors(heldout, device, self.facts["bos_id"])
        self.sampler = ImageSampler(len(self.train), cfg.batch_size, cfg.seed)

    def next_batch(self) -> tuple[VisionBatch, torch.Tensor]:
        """The next training (inputs, targets), on the training device."""
        index = torch.as_tensor(self.sampler.next_indices(), device=self.train.pixels.device)
        return self.train.batch(index)

    def heldout_batches(self, batch_size: int) -> Iterator[tuple[VisionBatch, torch.Tensor]]:
        """Every held-out image once, in order."""
        for start in range(0, len(self.heldout), batch_size):
            yield self.heldout.batch(slice(start, start + batch_size))

    def state_dict(self) -> dict[str, Any]:
        """Sampler position, and the identity of the corpus it is a position in."""
        return {**self.sampler.state_dict(), "corpus_fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the sampler position; a checkpoint made on another corpus (one replaced in the same folder) is
        refused, as text runs refuse other data."""
        saved = state.get("corpus_fingerprint")  # absent in checkpoints written before it was recorded
        if saved is not None and saved != self.fingerprint:
            raise PlelabError(f"cannot resume: the vision corpus {self.corpus} is not the one this run trained on "
                              "(its files changed since the checkpoint); put the run's corpus back or start a new "
                              "run")
        self.sampler.load_state_dict({k: v for k, v in state.items() if k != "corpus_fingerprint"})
