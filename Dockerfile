# sink-coordinator service image.
#   docker build -t ghcr.io/sink-coordinator/sink-coordinator:0.1.0 .
# Every dependency ships manylinux wheels for CPython 3.11, so no compiler is needed.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Only what the wheel is built from (see [tool.setuptools] in pyproject.toml).
COPY pyproject.toml README.md ./
COPY coordinator_service/ coordinator_service/
COPY spark_writer/ spark_writer/
COPY sink_coordinator_demo/ sink_coordinator_demo/
COPY migrations/ migrations/
# The server's dependencies only: the Spark writer's (pyspark, confluent-kafka) stay out of the image.
RUN /opt/venv/bin/pip install ".[server]" \
 && /opt/venv/bin/sink-coordinator --help >/dev/null

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
# The bytecode was compiled at install time; the root fs may be read-only.
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
