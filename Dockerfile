# syntax=docker/dockerfile:1
# fairness-exporter: Kafka prediction events in, per-subgroup fairness metrics out on :9108/metrics.
#   docker build -t fairness-exporter .
#   docker run -v "$PWD/config.yaml:/etc/fairness-exporter/config.yaml:ro" -p 9108:9108 fairness-exporter
# Secrets (e.g. KAFKA_PASSWORD for `${KAFKA_PASSWORD}` in the config) are given at run time, never baked in.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
# The package's extras in the image: storage (s3fs, gcsfs, adlfs) lets `audit` read an s3://, gs:// or az://
# evaluation_dataset and write reports there, as the seed's config and the chart's audit CronJob do. A daemon-only
# image, about 100 MB smaller: --build-arg FAIRNESS_EXTRAS= (empty).
ARG FAIRNESS_EXTRAS=storage

# ---- build: the project's wheel, installed with pinned dependencies into a virtualenv ----
FROM ${PYTHON_IMAGE} AS build
ARG FAIRNESS_EXTRAS
# PIP_BREAK_SYSTEM_PACKAGES: a Debian-packaged Python base (see `make image`) marks its pip externally managed;
# this stage is thrown away, so installing the build backend into it is harmless.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1
WORKDIR /src
COPY deploy/requirements.lock ./deploy/requirements.lock
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# The build backend comes from the lock too (no build isolation), so the wheel is built reproducibly.
RUN pip install --constraint deploy/requirements.lock setuptools wheel \
 && pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && python -m venv /opt/fairness-exporter \
 && wheel=$(ls /dist/*.whl) \
 && /opt/fairness-exporter/bin/pip install --constraint deploy/requirements.lock \
      "${wheel}${FAIRNESS_EXTRAS:+[${FAIRNESS_EXTRAS}]}" \
 && /opt/fairness-exporter/bin/pip check

# ---- runtime: the virtualenv only, run as an unprivileged numeric user ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fairness-exporter" \
      org.opencontainers.image.description="Per-subgroup fairness metrics of ML predictions from Kafka, for Prometheus" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 fairness \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fairness \
 && mkdir -p /etc/fairness-exporter /var/lib/fairness-exporter \
 && chown 10001:10001 /var/lib/fairness-exporter
COPY --from=build /opt/fairness-exporter /opt/fairness-exporter
ENV PATH=/opt/fairness-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/fairness-exporter
EXPOSE 9108
# /healthz over plain HTTP, or over TLS when the config serves TLS (exporter/serve/healthcheck.py)
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD ["python", "-m", "exporter.serve.healthcheck", "9108"]
ENTRYPOINT ["fairness-exporter"]
CMD ["serve", "--config", "/etc/fairness-exporter/config.yaml"]
