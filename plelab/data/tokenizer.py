"""Tokenizers: byte-level BPE (trained with `tokenizers`) and a plain byte tokenizer, behind one small class.

Both kinds are `tokenizers.Tokenizer` objects underneath and are saved as a `tokenizer.json` that
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` loads. Special tokens come first:
`<|endoftext|>` is id 0 and `<|pad|>` id 1. `Tokenizer.sha256` hashes the exact tokenizer.json text, so a
dataset manifest or a checkpoint can tell whether it was made with the same tokenizer as a model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from plelab.errors import PlelabError
from plelab.util.fs import atomic_write_bytes

EOT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOT, PAD)
# End-of-text names used by tokenizers made elsewhere, so a foreign tokenizer.json still works.
_EOT_CANDIDATES = (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")

# Llama-3-style split: letters, 1-3 digit groups, punctuation, newline runs. Every pretoken that contains a
# newline ends at the end of that newline run, which is what makes `split_pieces` encoding-preserving.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TokenizerError(PlelabError):
    """A tokenizer file that is missing, unreadable or unusable."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the alphabet of byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _byte_level_pipeline(tok: _HFTokenizer, use_regex: bool) -> None:
    if use_regex:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()


class Tokenizer:
    """A tokenizer.json-backed tokenizer: encode/decode, vocab size, end-of-text id, content hash."""

    def __init__(self, backend: _HFTokenizer, json_text: str | None = None):
        self._tok = backend
        # Keep the exact text we were loaded from so save() reproduces it byte for byte (stable sha256).
        self._json = json_text if json_text is not None else backend.to_str(pretty=True)
        self.sha256: str = hashlib.sha256(self._json.encode("utf-8")).hexdigest()
        vocab = backend.get_vocab(with_added_tokens=True)
        # max id + 1, not len(vocab): an embedding must cover every id even if the vocabulary has holes.
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        eot = next((backend.token_to_id(t) for t in _EOT_CANDIDATES if backend.token_to_id(t) is not None), None)
        if eot is None:
            raise TokenizerError(f"tokenizer has no end-of-text token (looked for {', '.join(_EOT_CANDIDATES)})")
        self.eot_id: int = eot
        self.pad_id: int | None = backend.token_to_id(PAD)

    # --- construction -------------------------------------------------------------------------------------------

    @classmethod
    def byte_level(cls, extra_special_tokens: Sequence[str] = ()) -> Tokenizer:
        """The plain byte tokenizer: specials first (`<|endoftext|>` = 0, `<|pad|>` = 1), then byte b = id b + 2."""
        specials = list(SPECIAL_TOKENS) + list(extra_special_tokens)
        vocab = {t: i for i, t in enumerate(specials)}
        for b, ch in sorted(bytes_to_unicode().items()):
            vocab[ch] = len(specials) + b
        tok = _HFTokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.add_special_tokens(specials)
        _byte_level_pipeline(tok, use_regex=False)  # one token per byte: no splitting needed
        return cls(tok)

    @classmethod
    def train_bpe(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 2,
        extra_special_tokens: Sequence[str] = (),
        show_progress: bool = False,
    ) -> Tokenizer:
        """Train a byte-level BPE on an iterable of texts (streamed: never materialised as a list)."""
        specials = list(SPECIAL_TOKENS) + list(extra_special_tokens)
        floor = 256 + len(specials)
        if vocab_size < floor:
            raise TokenizerError(f"vocab size {vocab_size} is too small for byte-level BPE (minimum {floor})")
        tok = _HFTokenizer(models.BPE())
        _byte_level_pipeline(tok, use_regex=True)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials,  # trainer assigns them ids 0, 1, ... in this order
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Build from tokenizer.json text."""
        try:
            backend = _HFTokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises a plain Exception with a serde message
            raise TokenizerError(f"not a valid tokenizer.json: {str(exc).splitlines()[0]}") from exc
        return cls(backend, json_text=text)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a tokenizer.json (or a directory containing one, e.g. a checkpoint or a prepared dataset)."""
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise TokenizerError(f"{path}: tokenizer file not found")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{p}: cannot read tokenizer ({exc})") from exc
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"{p}: not a tokenizer.json (invalid JSON: {exc.msg})") from exc
        try:
            return cls.from_json(text)
        except TokenizerError as exc:
            raise TokenizerError(f"{p}: {exc}") from exc

    # --- use ------------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS added; a literal `<|endoftext|>` in the text becomes the EOT id)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of several texts, encoded in parallel by the Rust backend."""
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids (invalid UTF-8 from partial byte sequences shows as U+FFFD)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string, or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        """Token string of an id, or None."""
        return self._tok.id_to_token(int(i))

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def to_json(self) -> str:
        """The tokenizer.json text (exactly what `save` writes and `sha256` hashes)."""
        return self._json

    def save(self, path: str | Path) -> Path:
        """Write tokenizer.json atomically (a directory path gets `tokenizer.json` inside it)."""
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, self._json.encode("utf-8"))
        return p

    def to_hf(self):
        """A `transformers.PreTrainedTokenizerFast` over the same tokenizer (needs transformers)."""
        from transformers import PreTrainedTokenizerFast

        eot = self.id_to_token(self.eot_id)
        pad = self.id_to_token(self.pad_id) if self.pad_id is not None else None
        return PreTrainedTokenizerFast(tokenizer_object=self._tok.__class__.from_str(self._json),
                                       eos_token=eot, bos_token=eot, pad_token=pad)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eot_id={self.eot_id}, sha256={self.sha256[:12]})"
