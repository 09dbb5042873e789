"""Tokenizers: byte-level BPE, Gemma-style BPE (both trained with `tokenizers`) and a plain byte tokenizer.

All kinds are `tokenizers.Tokenizer` objects underneath and are saved as a `tokenizer.json` that
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` loads. `Tokenizer.sha256` hashes the exact
tokenizer.json text, so a dataset manifest or a checkpoint can tell whether it was made with the same
tokenizer as a model.

    byte-level (default)  GPT-2 / Llama-3 style: text as bytes mapped to printable characters, Llama-3's split
                          regex; `<|endoftext|>` is id 0, `<|pad|>` id 1
    gemma                 what Gemma's own tokenizer.json is: spaces normalised to "▁", BPE over characters with
                          byte fallback (`<0x00>` ... `<0xFF>`), the decoder Replace("▁", " ") + ByteFallback +
                          Fuse; `<pad>` 0, `<eos>` 1 (end of text), `<unk>` 2, the 256 byte tokens 3..258.
                          llama.cpp's Gemma 4 converter reads only this kind (its `LlamaHfVocab`)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from plelab.errors import PlelabError
from plelab.util.fs import atomic_write_bytes

EOT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOT, PAD)
GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""The Gemma-style tokenizer's specials, in id order (Gemma's names: llama.cpp treats `<eos>` as end of generation)."""
KINDS = ("byte-level", "gemma")
"""Tokenizers `plelab data tokenizer --kind` trains."""
# End-of-text names used by tokenizers made elsewhere, so a foreign tokenizer.json still works.
_EOT_CANDIDATES = (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")
_PAD_CANDIDATES = (PAD, "<pad>")
_GEMMA_BYTES = tuple(f"<0x{b:02X}>" for b in range(256))
# Word boundaries while *training* the Gemma-style BPE: every newline alone, and a new word at each "▁". No merge
# learned this way joins a newline to anything or has a "▁" after its first character, so applying the merges to
# a whole text (what Gemma's tokenizer.json and llama.cpp's gemma4 tokenizer do; llama.cpp also cuts at newline
# runs) gives the same tokens as applying them word by word.
_GEMMA_TRAIN_SPLIT = [pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
                      pre_tokenizers.Split("▁", behavior="merged_with_next")]

# Llama-3-style split: letters, 1-3 digit groups, punctuation, newline runs. Every pretoken that contains a
# newline ends at the end of that newline run, which is what makes `split_pieces` encoding-preserving.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


TRAIN_RUN_CHARS = 256
"""Longest run of non-space characters tokenizer training sees whole; longer runs are cut (for training only)
with a newline, a boundary every kind's pre-tokenizer keeps. BPE training is quadratic in the length of a word,
so one unbroken 2 MB line took minutes; no useful token is this long (SentencePiece caps pieces at 16)."""
_LONG_RUN = re.compile(rf"\S{{{TRAIN_RUN_CHARS}}}(?=\S)")


def bounded_runs(texts: Iterable[str]) -> Iterator[str]:
    """`texts` with every run of non-space characters longer than TRAIN_RUN_CHARS cut by newlines."""
    for text in texts:
        yield _LONG_RUN.sub(lambda m: m.group(0) + "\n", text)


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


def gemma_style(vocab: dict[str, int], merges: list[tuple[str, str]]) -> _HFTokenizer:
    """A tokenizers.Tokenizer with Gemma's tokenizer.json pipeline around a BPE `vocab` / `merges`."""
    tok = _HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    # Gemma's split on " " comes after the normaliser removed every " ": it keeps the text whole.
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([t for t in GEMMA_SPECIAL_TOKENS if t in vocab])
    return tok


def tokenizer_kind(json_text: str) -> str:
    """'byte-level', 'gemma' (BPE with byte fallback and a Sequence decoder) or 'other', from tokenizer.json."""
    d = json.loads(json_text)
    model, decoder = d.get("model") or {}, d.get("decoder") or {}
    if model.get("type") == "BPE" and model.get("byte_fallback") and decoder.get("type") == "Sequence":
        return "gemma"
    if "ByteLevel" in json.dumps(d.get("pre_tokenizer")) or decoder.get("type") == "ByteLevel":
        return "byte-level"
    return "other"


TOKENIZING_PARTS = ("model", "normalizer", "pre_tokenizer", "decoder", "added_tokens")
"""The parts of a tokenizer.json that decide the ids of a text (plelab encodes without special tokens, so the
post-processor, padding and truncation do not; transformers adds an empty post-processor when it saves one)."""
PROBE_TEXT = ("Once upon a time, 42 foxes ran 3.5 km!\n\tdef f(x):  return x ** 2\n\n"
              f"Café naïve 日本語 🦊 {EOT} <pad> <eos> ▁end")
"""Text whose ids two tokenizers must agree on to count as the same: words, digits, whitespace runs, code,
non-ASCII, emoji (bytes outside most vocabularies) and special-token spellings."""


def tokenizer_difference(a: Tokenizer, b: Tokenizer) -> str | None:
    """None when `a` and `b` tokenize alike (the same bytes, or the same `TOKENIZING_PARTS` and the same ids for
    `PROBE_TEXT`), else what differs, in words."""
    if a.sha256 == b.sha256:
        return None
    da, db = json.loads(a.to_json()), json.loads(b.to_json())
    for part in TOKENIZING_PARTS:
        pa, pb = _canonical(part, da.get(part)), _canonical(part, db.get(part))
        if pa != pb:
            return f"their {part.replace('_', '-')} differs{_part_detail(part, pa, pb)}"
    if a.encode(PROBE_TEXT) != b.encode(PROBE_TEXT):
        return "they give a probe text different ids"
    return None


def _canonical(part: str, value):
    """A part as compared: BPE merges as pairs (the file spells them "a b" or ["a", "b"] by version)."""
    if part == "model" and isinstance(value, dict) and isinstance(value.get("merges"), list):
        value = {**value, "merges": [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                                     for m in value["merges"]]}
    return value


def _part_detail(part: str, a, b) -> str:
    if part == "model" and isinstance(a, dict) and isinstance(b, dict):
        va, vb = a.get("vocab") or {}, b.get("vocab") or {}
        if len(va) != len(vb):
            return f" ({len(va):,} against {len(vb):,} vocabulary entries)"
        if va != vb:
            token = next(t for t in va if vb.get(t) != va[t])
            return f" (the token {token!r} has id {va[token]} against {vb.get(token)})"
        if a.get("merges") != b.get("merges"):
            return " (the same vocabulary, other merges)"
    if part == "added_tokens" and isinstance(a, list) and isinstance(b, list):
        return f" ({len(a)} against {len(b)} added tokens)" if len(a) != len(b) else ""
    return ""


class Tokenizer:
    """A tokenizer.json-backed tokenizer: encode/decode, vocab size, end-of-text id, content hash."""

    def __init__(self, backend: _HFTokenizer, json_text: str | None = None):
        self._tok = backend
        # Keep the exact text we were loaded from so save() reproduces it byte for byte (stable sha256).
        self._json = json_text if json_text is not None else backend.to_str(pretty=True)
        self.sha256: str = hashlib.sha256(self._json.encode("utf-8")).hexdigest()
        self.kind: str = tokenizer_kind(self._json)
        """'byte-level', 'gemma' or 'other' (see `tokenizer_kind`)."""
        vocab = backend.get_vocab(with_added_tokens=True)
        # max id + 1, not len(vocab): an embedding must cover every id even if the vocabulary has holes.
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        eot = next((backend.token_to_id(t) for t in _EOT_CANDIDATES if backend.token_to_id(t) is not None), None)
        if eot is None:
            raise TokenizerError(f"tokenizer has no end-of-text token (looked for {', '.join(_EOT_CANDIDATES)})")
        self.eot_id: int = eot
        self.pad_id: int | None = next(
            (backend.token_to_id(t) for t in _PAD_CANDIDATES if backend.token_to_id(t) is not None), None
        )

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
        tok.train_from_iterator(bounded_runs(texts), trainer=trainer)
        return cls(tok)

    @classmethod
    def train_gemma(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        *,
        min_frequency: int = 2,
        show_progress: bool = False,
    ) -> Tokenizer:
        """Train a Gemma-style BPE (characters, byte fallback, "▁" for spaces; see the module docstring)."""
        specials = list(GEMMA_SPECIAL_TOKENS)
        floor = len(specials) + len(_GEMMA_BYTES) + 1
        if vocab_size < floor:
            raise TokenizerError(f"vocab size {vocab_size} is too small for a Gemma-style BPE (minimum {floor}: "
                                 f"{len(specials)} specials, 256 byte tokens, one character)")
        learned = vocab_size - len(_GEMMA_BYTES)  # the byte tokens are added after training
        trainer_tok = _HFTokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        trainer_tok.normalizer = normalizers.Replace(" ", "▁")
        trainer_tok.pre_tokenizer = pre_tokenizers.Sequence(_GEMMA_TRAIN_SPLIT)
        trainer = trainers.BpeTrainer(
            vocab_size=learned, min_frequency=min_frequency, special_tokens=specials, show_progress=show_progress,
            # Rare characters are left to the byte fallback, as SentencePiece's character coverage does.
            limit_alphabet=max(1, min(1000, (learned - len(specials)) // 2)),
        )
        trainer_tok.train_from_iterator(bounded_runs(texts), trainer=trainer)
        trained = json.loads(trainer_tok.to_str())["model"]
        order = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
        vocab = {t: i for i, t in enumerate(specials + list(_GEMMA_BYTES))}
        for token, _ in order:
            vocab.setdefault(token, len(vocab))
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
        return cls(gemma_style(vocab, merges))

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
        unk = {"unk_token": "<unk>"} if self.token_to_id("<unk>") is not None else {}
        return PreTrainedTokenizerFast(tokenizer_object=self._tok.__class__.from_str(self._json),
                                       eos_token=eot, bos_token=eot, pad_token=pad, **unk)

    def padded_to(self, vocab_size: int) -> Tokenizer:
        """This tokenizer with special tokens `<unusedN>` appended up to `vocab_size` ids (a model's embedding may
        have more rows than its tokenizer has ids; llama.cpp wants one token per row). Encoding is unchanged."""
        if vocab_size <= self.vocab_size:
            return self
        tok = _HFTokenizer.from_str(self._json)
        tok.add_special_tokens([f"<unused{i}>" for i in range(vocab_size - self.vocab_size)])
        return Tokenizer(tok)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eot_id={self.eot_id}, sha256={self.sha256[:12]})"
