# syntax=docker/dockerfile:1
# One image for every Agent Platform service (web, worker, llm); see docker-compose.yml.
#
#   docker build -t agent-platform .
#
# llama-cpp-python (the `llm` extra) compiles llama.cpp from source: ~5 minutes on 2 cores
# the first time. The pip cache mount keeps the built wheel across rebuilds.
# By default llama.cpp is built portable (GGML_NATIVE=OFF: AVX2, FMA, F16C), as
# scripts/bootstrap.sh does: its native build (-march=native) crashed at the first completion
# on a CPU with AMX in a VM. For the build machine's own CPU, pass
#   --build-arg LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON"
FROM python:3.11-slim

ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# build-essential + cmake: to compile llama.cpp (gcc also brings libgomp, needed at run time).
# bubblewrap: the sandbox of CLI commands (README, "CLI commands").
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake bubblewrap \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first (a layer that survives source changes): the project's direct
# dependencies and the `llm` extra, pinned by constraints.txt.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['llm']))" > /tmp/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" pip install -c constraints.txt -r /tmp/requirements.txt

# The project itself (editable, so manage.py, scripts/ and the packages share one tree).
COPY . .
RUN --mount=type=cache,target=/root/.cache/pip \
    CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" pip install -c constraints.txt -e '.[llm]'
# The project's own bytecode, now: pip compiled the dependencies, but PYTHONDONTWRITEBYTECODE
# (above) and the read-only tree (USER app below) would otherwise make every process compile the
# project's modules at every start, and again at each first import of a tool's module in a run.
RUN python -m compileall -q -j 0 -x '(^|/)(node_modules|var)/' .

# Static files are served by WhiteNoise from STATIC_ROOT (var/staticfiles). The settings refuse
# to import without keys, so this step gets throwaway random ones, which live only in this RUN's
# environment: no key ends up in the image (the real ones come from the environment at run time).
RUN SECRETS_FILE= \
    SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    ENCRYPTION_KEY="$(python -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')" \
    python manage.py collectstatic --noinput -v 0

# Run unprivileged. /app/var holds the model (llm service: a named volume) and static files.
RUN useradd --create-home --uid 10001 app \
    && mkdir -p /app/var/models /app/var/cache/model-wheels \
    && chown -R app:app /app/var
USER app

EXPOSE 8000 8081
CMD ["python", "-m", "agent_platform.web", "--host", "0.0.0.0", "--port", "8000"]
