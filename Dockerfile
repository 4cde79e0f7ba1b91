# syntax=docker/dockerfile:1
# The tracker's container image: every command (`tracker watch`, `reduce`, `sink index`, `serve`, `doctor`, ...)
# with the dependencies locked in uv.lock. Build from the repository root:
#   docker build -t tracker:0.1.0 .
# Runs as the numeric user 10001 and writes only to /var/lib/tracker (the experiment index, the watcher's
# checkpoint, the ADX spool) and /tmp: mount a volume or an emptyDir at each and the root filesystem can be
# read-only. The metrics/health port is 9090 (TRACKER_OPS__METRICS_PORT).
# The core runs as plain Python; --build-arg TRACKER_CORE=compiled compiles it with mypyc in the build stage (a C
# compiler and the compile dependency group there only; README, "A compiled core").

# Both stages from the same Python image, so that the virtual environment's interpreter links resolve.
# Pin it by digest for reproducible builds: --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG UV_VERSION=0.13.9
ARG TRACKER_CORE=pure
RUN pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}"
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
# dependencies first, in their own layer: it is rebuilt only when the lock changes
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project
# then the project (installed editable: it reads files of the source tree at run time, found relative to the
# package): the JSON schemas, the Kusto schema of `tracker kusto apply`, the watcher's RBAC of `tracker doctor`
COPY tracker ./tracker
COPY schemas ./schemas
COPY deploy/k8s/rbac ./deploy/k8s/rbac
COPY deploy/compiled ./deploy/compiled
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev \
 && case "$TRACKER_CORE" in \
      pure) ;; \
      compiled) apt-get update \
          && apt-get install -y --no-install-recommends gcc libc6-dev \
          && uv sync --frozen --no-dev --group compile \
          && .venv/bin/python deploy/compiled/build_core.py \
          && uv sync --frozen --no-dev ;; \
      *) echo "error: TRACKER_CORE must be pure or compiled, not '$TRACKER_CORE'" >&2; exit 2 ;; \
    esac \
 && python -m compileall -q tracker

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 tracker \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tracker \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/tracker
# owned by root and read-only for the tracker user
COPY --from=build /app /app
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TRACKER_OPS__METRICS_HOST=0.0.0.0 \
    TRACKER_OPS__METRICS_PORT=9090 \
    TRACKER_ADX__SPOOL_DIR=/var/lib/tracker/adx-spool
WORKDIR /var/lib/tracker
VOLUME ["/var/lib/tracker", "/tmp"]
USER 10001:10001
EXPOSE 9090
# the service commands answer GET /healthz on the metrics port while their event loop runs
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TRACKER_OPS__METRICS_PORT', '9090'), timeout=4)"]
ENTRYPOINT ["tracker"]
CMD ["--help"]
