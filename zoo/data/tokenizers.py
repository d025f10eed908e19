"""Tokenizers: ``char``, ``byte``, ``bpe`` and pretrained ``hf:<name>``, all with the same interface and special ids.

Every tokenizer reserves the first ``n_special`` ids for `SPECIALS`, in that order, so padding,
BOS/EOS, the MLM mask and the T5 sentinels have the same ids whatever the tokenizer:

    pad=0, bos=1, eos=2, mask=3, <extra_0>..<extra_15> = 4..19

Special tokens are never parsed out of text: ``encode("<eos>")`` gives the ids of the characters
``<``, ``e``, ... (for every tokenizer), so a prompt cannot inject control tokens. Add them by id.

A tokenizer is saved as ``state_dict()`` (plain JSON data, safe to put in a checkpoint) and rebuilt
with ``tokenizer_from_state(d)`` or ``<Class>.from_state(d)``; no pickle involved.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from zoo.commands import needs
from zoo.data.corpus import DataError
from zoo.io import atomic_write_text, first_line, read_json
from zoo.net import bound_network

SPECIALS: list[str] = ["<pad>", "<bos>", "<eos>", "<mask>"] + [f"<extra_{i}>" for i in range(16)]
N_SPECIAL = len(SPECIALS)
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3
SENTINEL_IDS: list[int] = list(range(4, N_SPECIAL))

_FILE_FORMAT = "zoo-tokenizer/1"


class Tokenizer:
    """Shared interface. Subclasses implement `_fit`, `_encode_text`, `_decode_run` and state."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()  # keyword options build_tokenizer() accepts

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    mask_id: int = MASK_ID
    n_special: int = N_SPECIAL

    @property
    def sentinel_ids(self) -> list[int]:
        """Ids of ``<extra_0>``..``<extra_15>`` (T5 span-corruption sentinels)."""
        return list(SENTINEL_IDS)

    @property
    def specials(self) -> list[str]:
        return list(SPECIALS)

    # -- to implement -------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        raise NotImplementedError

    def _vocab_size(self) -> int:
        raise NotImplementedError

    def _fit(self, text: str) -> None:
        raise NotImplementedError

    def _encode_text(self, text: str, errors: str) -> list[int]:
        raise NotImplementedError

    def _decode_run(self, ids: list[int]) -> str:
        """Decode a run of non-special ids."""
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, d: dict[str, Any]) -> None:
        pass

    # -- public interface ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Total number of ids, specials included (size the embedding with this)."""
        self._require_fitted()
        return self._vocab_size()

    def fit(self, text: str) -> Tokenizer:
        """Learn the vocabulary from training text; returns self."""
        if not isinstance(text, str) or not text:
            raise DataError(f"tokenizer: {self.name} needs non-empty training text to fit")
        self._fit(text)
        return self

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        """Text -> ids (no BOS/EOS added).

        ``errors`` matters only for tokenizers with a closed alphabet (``char``): ``"strict"``
        raises on unseen characters, ``"replace"`` drops them. ``byte`` and ``bpe`` accept any text.
        """
        self._check_encode(errors)
        return self._encode_text(text, errors)

    def encode_array(self, text: str, errors: str = "strict") -> np.ndarray:
        """`encode` as an integer array (int64, or int32 where the tokenizer's ids fit it): how a corpus is kept
        (TextData; its windows become int64 tensors, zoo.training.data.TokenSplit)."""
        self._check_encode(errors)
        return self._encode_array(text, errors)

    def _encode_array(self, text: str, errors: str) -> np.ndarray:
        return np.array(self._encode_text(text, errors), dtype=np.int64)

    def _check_encode(self, errors: str) -> None:
        if errors not in ("strict", "replace"):
            raise ValueError(f"tokenizer: errors must be 'strict' or 'replace', got {errors!r}")
        self._require_fitted()

    @property
    def eot_id(self) -> int:
        """The id that ends a document in a prepared corpus (zoo.prepare): <eos> for zoo's tokenizers."""
        return EOS_ID

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text (strict); tokenizers with a parallel batch encoder override it."""
        self._require_fitted()
        return [self._encode_text(t, "strict") for t in texts]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Ids -> text; specials come out as their names (``<eos>``) unless ``skip_special``."""
        self._require_fitted()
        ids = [int(i) for i in ids]  # accepts tensors / numpy arrays of ints too
        size = self._vocab_size()
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"tokenizer: id {bad[0]} out of range for {self.name} vocab of size {size}")
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if i < N_SPECIAL:
                if run:
                    out.append(self._decode_run(run))
                    run = []
                if not skip_special:
                    out.append(SPECIALS[i])
            else:
                run.append(i)
        if run:
            out.append(self._decode_run(run))
        return "".join(out)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable description from which `from_state` rebuilds an identical tokenizer."""
        self._require_fitted()
        return {"name": self.name, "specials": list(SPECIALS), **self._state()}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Tokenizer:
        """Rebuild from `state_dict()` output (dispatches on ``d["name"]`` when called on the base)."""
        name = d.get("name")
        target = _FROM_STATE.get(name) if cls is Tokenizer else cls
        if target is None or name != target.name:
            raise DataError(f"tokenizer: state is for {name!r}, expected {cls.name or 'a known tokenizer'!r}")
        if d.get("specials", SPECIALS) != SPECIALS:
            # Ids of pad/bos/eos/... would silently shift; refuse rather than mis-decode.
            raise DataError("tokenizer: saved special tokens differ from this version's SPECIALS")
        tok = target.__new__(target)
        tok._init_empty()
        tok._load_state(d)
        return tok

    def save(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
        """Write ``state_dict()`` (plus optional ``meta``) as JSON, atomically."""
        payload = {"format": _FILE_FORMAT, "meta": meta or {}, "tokenizer": self.state_dict()}
        atomic_write_text(Path(path), json.dumps(payload, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read a file written by `save`."""
        return cls.from_state(_read_saved(Path(path))["tokenizer"])

    def __repr__(self) -> str:
        size = self._vocab_size() if self.fitted else "unfitted"
        return f"{type(self).__name__}(vocab_size={size})"

    # -- helpers ------------------------------------------------------------------------------
    def _init_empty(self) -> None:
        """Set attributes to the unfitted state (used by __init__ and from_state)."""

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise DataError(f"tokenizer: {self.name} is not fitted; call fit(train_text) first")


class CharTokenizer(Tokenizer):
    """One id per character seen in the training text (sorted), after the specials."""

    name = "char"

    def __init__(self) -> None:
        self._init_empty()

    def _init_empty(self) -> None:
        self.chars: list[str] = []
        self._stoi: dict[str, int] = {}

    @property
    def fitted(self) -> bool:
        return bool(self.chars)

    def _vocab_size(self) -> int:
        return N_SPECIAL + len(self.chars)

    def _set_chars(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self._stoi = {c: N_SPECIAL + i for i, c in enumerate(self.chars)}

    def _fit(self, text: str) -> None:
        self._set_chars(sorted(set(text)))

    def _encode_text(self, text: str, errors: str) -> list[int]:
        stoi = self._stoi
        try:
            return [stoi[c] for c in text]  # fast path: no unknown characters
        except KeyError:
            pass
        if errors == "replace":
            # Fallback: unknown characters are dropped. There is no <unk> id, and any stand-in
            # character would be a made-up token the model never saw next to these neighbours.
            return [stoi[c] for c in text if c in stoi]
        unknown = list(dict.fromkeys(c for c in text if c not in stoi))
        shown = ", ".join(repr(c) for c in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise ValueError(
            f"text has characters the char tokenizer never saw: {shown}{more} "
            f"(tokenizer trained on {len(self.chars)} characters); use tokenizer=byte to accept any text"
        )

    def _encode_array(self, text: str, errors: str) -> np.ndarray:
        """One table lookup for the whole text (a corpus of millions of characters: milliseconds, not a Python int
        per character). Characters it never saw: dropped (replace), or `_encode_text`'s error naming them."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        points = [ord(c) for c in self.chars]
        table = np.full(max(points) + 2, -1, dtype=np.int32)  # its last entry stands for every code point above
        table[points] = np.arange(N_SPECIAL, N_SPECIAL + len(points))
        ids = table[np.minimum(codes, len(table) - 1)]
        unseen = ids < 0
        if unseen.any():
            if errors == "strict":
                self._encode_text(text, errors)  # raises, naming them
            ids = ids[~unseen]
        return ids  # int32: a copy to int64 would cost a corpus of millions of characters 70 ms

    def _decode_run(self, ids: list[int]) -> str:
        chars = self.chars
        return "".join(chars[i - N_SPECIAL] for i in ids)

    def _state(self) -> dict[str, Any]:
        return {"chars": "".join(self.chars)}

    def _load_state(self, d: dict[str, Any]) -> None:
        self._set_chars(list(d["chars"]))


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: id = n_special + byte value; any text encodes, nothing to learn."""

    name = "byte"

    def __init__(self) -> None:
        self._init_empty()

    @property
    def fitted(self) -> bool:
        return True

    def _vocab_size(self) -> int:
        return N_SPECIAL + 256

    def fit(self, text: str) -> ByteTokenizer:
        return self  # fixed vocabulary; accepts empty text too

    def _encode_text(self, text: str, errors: str) -> list[int]:
        # surrogatepass: even lone surrogates (from odd decoders) encode rather than crash.
        return [N_SPECIAL + b for b in text.encode("utf-8", errors="surrogatepass")]

    def _decode_run(self, ids: list[int]) -> str:
        # Generated byte sequences can be invalid UTF-8; show U+FFFD instead of failing.
        return bytes(i - N_SPECIAL for i in ids).decode("utf-8", errors="replace")


# Cut points for chunked BPE encoding: right after a lone "\n" between two non-space characters.
# There the byte-level pre-tokenizer puts "\n" in a piece of its own whether or not the text
# continues, so encoding the chunks separately gives exactly the ids of encoding the whole.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")
_CHUNK_CHARS = 1 << 16


def _chunks(text: str, size: int = _CHUNK_CHARS) -> list[str]:
    if len(text) <= 2 * size:
        return [text]
    pieces, start = [], 0
    while len(text) - start > 2 * size:
        m = _SAFE_CUT.search(text, start + size)
        if m is None:
            break
        pieces.append(text[start : m.start()])
        start = m.start()
    pieces.append(text[start:])
    return pieces


class BPETokenizer(Tokenizer):
    """Byte-level BPE trained with Hugging Face `tokenizers`; specials are ids 0..19."""

    name = "bpe"
    options = ("vocab_size",)
    MIN_VOCAB = N_SPECIAL + 256  # the specials plus the 256-byte base alphabet

    def __init__(self, vocab_size: int = 1024) -> None:
        if not isinstance(vocab_size, int) or vocab_size < self.MIN_VOCAB:
            raise DataError(
                f"tokenizer.vocab_size: bpe needs at least {self.MIN_VOCAB} "
                f"({N_SPECIAL} specials + 256 bytes), got {vocab_size}"
            )
        self._init_empty()
        self.target_vocab_size = vocab_size

    def _init_empty(self) -> None:
        self.target_vocab_size = 1024
        self._tok = None

    @property
    def fitted(self) -> bool:
        return self._tok is not None

    def _vocab_size(self) -> int:
        # May be below target_vocab_size when the text has too few distinct pairs to merge.
        return self._tok.get_vocab_size()

    def _configure(self, tok: Any) -> Any:
        if hasattr(tok, "encode_special_tokens"):
            # Treat "<eos>" in text as plain characters (not serialised in the JSON, so set on load).
            tok.encode_special_tokens = True
        for i, s in enumerate(SPECIALS):
            if tok.token_to_id(s) != i:
                raise DataError(f"tokenizer: bpe special {s!r} has id {tok.token_to_id(s)}, expected {i}")
        return tok

    def _fit(self, text: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        # add_prefix_space=False keeps decode(encode(x)) == x exactly.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.target_vocab_size,
            special_tokens=SPECIALS,  # first, in order -> ids 0..19
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
            show_progress=False,
        )
        tok.train_from_iterator(_chunks(text), trainer=trainer)
        self._tok = self._configure(tok)

    def _encode_text(self, text: str, errors: str) -> list[int]:
        pieces = _chunks(text)
        if len(pieces) == 1:
            return self._tok.encode(text, add_special_tokens=False).ids
        # Long texts: encode safe chunks in parallel (the Rust side uses all cores).
        out: list[int] = []
        for enc in self._tok.encode_batch(pieces, add_special_tokens=False):
            out.extend(enc.ids)
        return out

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self._require_fitted()
        if any(len(t) > 2 * _CHUNK_CHARS for t in texts):
            return [self._encode_text(t, "strict") for t in texts]  # long texts: split at safe cut points
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def _decode_run(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def _state(self) -> dict[str, Any]:
        return {"vocab_size": self.target_vocab_size, "tokenizer_json": self._tok.to_str()}

    def _load_state(self, d: dict[str, Any]) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.target_vocab_size = int(d.get("vocab_size", 1024))
        self._tok = self._configure(HFTokenizer.from_str(d["tokenizer_json"]))


class HFTokenizer(Tokenizer):
    """A pretrained Hugging Face tokenizer (``hf:<name or local dir>``), its ids shifted past zoo's specials.

    zoo id = ``n_special`` + the pretrained id, so pad, bos, eos, mask and the sentinels keep zoo's ids and
    every objective works unchanged; the pretrained tokenizer's own special tokens are ordinary ids after
    them. The state holds the tokenizer's whole definition (its ``tokenizer.json``): a checkpoint or a
    prepared corpus rebuilds it without the original directory, the hub, or ``transformers``."""

    name = "hf"

    def __init__(self, source: str) -> None:
        self._init_empty()
        self.source = source
        local = Path(source).expanduser()
        if source.startswith(("/", ".", "~")) and not local.is_dir():
            raise DataError(f"tokenizer: 'hf:{source}': no such directory (a save_pretrained folder or a hub name)")
        if local.is_dir():  # as for init_from: no file read through a link out of it, no FIFO where a file belongs
            from zoo.convert import ConversionError, check_directory  # lazy: torch (2.7 s); prepare runs without

            try:
                check_directory(local)
            except ConversionError as e:
                raise DataError(f"tokenizer: 'hf:{source}': {e}") from None
        try:
            from transformers import AutoTokenizer  # optional: hf
        except ImportError:
            raise DataError(needs("transformers", "hf", "tokenizer: hf:<name>")) from None
        bound_network()  # a hub that never answers: ZOO_NET_TIMEOUT_S, not forever
        try:
            pretrained = AutoTokenizer.from_pretrained(str(Path(source).expanduser()))
        except Exception as e:  # offline hub misses, bad directories: one line, whatever the library raised
            first = first_line(e)
            raise DataError(f"tokenizer: cannot load Hugging Face tokenizer 'hf:{source}' ({first})") from None
        if not getattr(pretrained, "is_fast", False):
            raise DataError(f"tokenizer: 'hf:{source}' has no fast (tokenizers) version; zoo needs one")
        self._set(pretrained.backend_tokenizer.to_str(), pretrained.eos_token_id)

    def _init_empty(self) -> None:
        self.source, self._tok, self.native_eot = "", None, None

    def _set(self, tokenizer_json: str, native_eot: int | None) -> None:
        from tokenizers import Tokenizer as Backend

        self._tok = Backend.from_str(tokenizer_json)
        if hasattr(self._tok, "encode_special_tokens"):
            self._tok.encode_special_tokens = True  # "<|endoftext|>" in text is text, as for zoo's tokenizers
        self.native_eot = native_eot

    @property
    def fitted(self) -> bool:
        return self._tok is not None

    @property
    def eot_id(self) -> int:
        """The pretrained end-of-text token where the tokenizer has one (GPT-2's <|endoftext|>), else <eos>."""
        return EOS_ID if self.native_eot is None else N_SPECIAL + self.native_eot

    def _vocab_size(self) -> int:
        return N_SPECIAL + self._tok.get_vocab_size(with_added_tokens=True)

    def fit(self, text: str) -> HFTokenizer:
        return self  # pretrained: nothing to learn

    def _encode_text(self, text: str, errors: str) -> list[int]:
        return [N_SPECIAL + i for i in self._tok.encode(text, add_special_tokens=False).ids]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[N_SPECIAL + i for i in e.ids] for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def _decode_run(self, ids: list[int]) -> str:
        return self._tok.decode([i - N_SPECIAL for i in ids], skip_special_tokens=False)

    def _state(self) -> dict[str, Any]:
        return {"source": self.source, "eot": self.native_eot, "tokenizer_json": self._tok.to_str()}

    def _load_state(self, d: dict[str, Any]) -> None:
        self.source = d.get("source", "")
        self._set(d["tokenizer_json"], d.get("eot"))


TOKENIZERS: dict[str, type[Tokenizer]] = {  # built by name (and fitted); pretrained ones by hf:<name>
    "bpe": BPETokenizer,
    "byte": ByteTokenizer,
    "char": CharTokenizer,
}
_FROM_STATE: dict[str, type[Tokenizer]] = {**TOKENIZERS, "hf": HFTokenizer}
HF_PREFIX = "hf:"  # build_tokenizer("hf:gpt2"), build_tokenizer("hf:path/to/saved_dir")


def build_tokenizer(name: str, **kw: Any) -> Tokenizer:
    """Construct an (unfitted) tokenizer by name; one-line errors for unknown names or options."""
    if isinstance(name, str) and name.startswith(HF_PREFIX) and name != HF_PREFIX:
        if kw:
            raise DataError(f"tokenizer: '{name}' is pretrained and has no option '{sorted(kw)[0]}'")
        return HFTokenizer(name.removeprefix(HF_PREFIX))
    if name not in TOKENIZERS:
        raise DataError(f"tokenizer: unknown '{name}'; valid: {', '.join(sorted(TOKENIZERS))}, "
                        "hf:<Hugging Face name or directory>")
    cls = TOKENIZERS[name]
    extra = sorted(set(kw) - set(cls.options))
    if extra:
        valid = ", ".join(cls.options) or "none"
        raise DataError(f"tokenizer: '{name}' has no option '{extra[0]}' (options: {valid})")
    return cls(**kw)


def tokenizer_from_state(d: dict[str, Any]) -> Tokenizer:
    """Rebuild any tokenizer from its `state_dict()` (e.g. one stored in a checkpoint)."""
    return Tokenizer.from_state(d)


def text_fingerprint(text: str) -> str:
    """SHA-256 of the UTF-8 text; identifies the training text a cached tokenizer was fit on."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def _read_saved(path: Path) -> dict[str, Any]:
    try:
        payload = read_json(path)
    except FileNotFoundError:
        raise DataError(f"tokenizer: no saved tokenizer at '{path}'") from None
    except (OSError, ValueError) as e:  # FileFormatError: too large, too deep, not JSON
        raise DataError(f"tokenizer: cannot read '{path}': {e}") from None
    if not isinstance(payload, dict) or payload.get("format") != _FILE_FORMAT:
        raise DataError(f"tokenizer: '{path}' is not a saved tokenizer ({_FILE_FORMAT})")
    return payload


def cached_bpe(text: str, cache_path: str | os.PathLike[str], vocab_size: int = 1024) -> BPETokenizer:
    """Load the BPE tokenizer cached at ``cache_path`` if it was trained on this exact text with
    this vocab size; otherwise train one and write it there (atomically) for next time.

    A missing, unreadable or stale cache is never an error: it is just retrained and overwritten.
    """
    path = Path(cache_path)
    meta = {"text_sha256": text_fingerprint(text), "vocab_size": vocab_size}
    try:
        if path.is_file():
            payload = _read_saved(path)
            if payload.get("meta") == meta:
                return BPETokenizer.from_state(payload["tokenizer"])  # type: ignore[return-value]
    except (DataError, KeyError, TypeError, ValueError, OSError):
        pass  # stale, damaged or unreadable cache: fall through and rebuild it
    tok = BPETokenizer(vocab_size=vocab_size).fit(text)
    try:
        tok.save(path, meta=meta)
    except OSError as e:  # an unwritable cache folder: train on without the cache
        print(f"warning: tokenizer cache: cannot write '{path}' ({e.strerror or type(e).__name__}); "
              "going on without the cache", file=sys.stderr, flush=True)
    return tok
