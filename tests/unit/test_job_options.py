"""The sink-writer job's option parsing, without Spark."""

from __future__ import annotations

import inspect
import json
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from confluent_kafka.schema_registry import Schema
from pyspark.sql.types import LongType, StructField, StructType
from typer.testing import CliRunner

from sink_coordinator_demo.ports import free_port
from spark_writer import job, job_run
from spark_writer.driver_jvm import SparkLog
from spark_writer.formats.json_decoding import check_time_zone
from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.formats.schema_registry import RegistrySettings, registry_client
from spark_writer.job_failures import ExitCode, JobFailure
from spark_writer.job_records import task_ranges
from spark_writer.job_settings import KafkaSettings, KafkaSource, ParseSettings, RecordFormat
from spark_writer.kafka.options import parse_options
from spark_writer.mutations.modes import MutationMode, Mutations
from spark_writer.routing.routes import Routes, Unrouted
from spark_writer.session import retries_tasks, with_task_retries
from spark_writer.sink.kafka_records import JsonBatchParser
from tests.fixtures.writer_cli import COORDINATOR_FLAG, REQUIRED, Started


@pytest.mark.parametrize(
    ("text", "size"),
    [("134217728", 134217728), ("128MiB", 128 * 2**20), ("64 MB", 64 * 10**6), ("1gib", 2**30), ("1.5GiB", 3 * 2**29)],
)
def test_target_file_size_takes_bytes_or_a_unit(started: Started, text: str, size: int) -> None:
    result = started.invoke("--target-file-size", text)
    assert result.exit_code == 0, result.output
    assert started.sink.target_file_size_bytes == size


def test_key_value_flags(started: Started) -> None:
    result = started.invoke(
        "--kafka-option", "security.protocol=SSL", "--kafka-option", "sasl.password=a=b",
        "--storage", "s3.region=eu-west-1", "--storage", "s3.endpoint=",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert started.kafka.consumer_options == {"security.protocol": "SSL", "sasl.password": "a=b"}
    assert started.sink.storage == {"s3.region": "eu-west-1", "s3.endpoint": ""}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target-file-size", "12 parsecs"], "Invalid value for '--target-file-size': '12 parsecs' is not a size"),
        (["--target-file-size", "-5MiB"], "Invalid value for '--target-file-size': '-5MiB' is not a size"),
        (["--target-file-size", "0"], "--target-file-size must be positive, got 0"),
        (["--storage", "s3.region"], "Invalid value for '--storage': 's3.region' is not key=value"),
        (["--kafka-option", "=SSL"], "Invalid value for '--kafka-option': '=SSL' is not key=value"),
        (["--storage", "s3.colour=blue"], "unknown storage properties ['s3.colour']"),
        (["--starting-offsets", "bogus"], "startingOffsets must be 'earliest', 'latest' or JSON"),
        (["--starting-offsets", '{"orders": {"0": -5}}'], "startingOffsets for orders-0 must be an offset >= 0"),
        (["--starting-offsets", '["orders"]'], "startingOffsets JSON must be an object of topics"),
        (["--kafka-option", "isolation.level=read_uncommitted"], "kafka.isolation.level cannot be set"),
        (["--kafka-option", "enable.auto.commit=true"], "kafka.enable.auto.commit cannot be set"),
        (["--source", "spark", "--kafka-option", "enable.auto.commit=true"], "kafka.enable.auto.commit cannot be set"),
        (["--table", "Shop.Orders"], "Invalid value for '--table': table identifier 'Shop.Orders' contains"),
        (["--table", "orders"], "Invalid value for '--table': table identifier 'orders' must be 'namespace.table'"),
        (["--sink", "-s"], "Invalid value for '--sink': sink name '-s' is invalid"),
        (["--partition-by", "bucket(4, id)"], "Invalid value for '--partition-by': partition field 'bucket(4, id)'"),
        (["--partition-by", "day(ts"], "Invalid value for '--partition-by': partition field 'day(ts' is not under"),
        (["--partition-by", "truncate(0, s)"], "Invalid value for '--partition-by': partition field 'truncate(0, s)'"),
        (["--partition-by", ""], "Invalid value for '--partition-by': partition field '' is not understood"),
        (["--wait-for-topic", "-1"], "Invalid value for '--wait-for-topic': '-1' is not between 0 and 86400 seconds"),
        (["--wait-for-topic", "nan"], "Invalid value for '--wait-for-topic': 'nan' is not between 0 and 86400"),
        (["--wait-for-topic", "inf"], "Invalid value for '--wait-for-topic': 'inf' is not between 0 and 86400"),
        (["--wait-for-topic", "1e400"], "Invalid value for '--wait-for-topic': '1e400' is not between 0 and 86400"),
        (["--wait-for-topic", "86401"], "Invalid value for '--wait-for-topic': '86401' is not between 0 and 86400"),
        (["--wait-for-topic", "soon"], "Invalid value for '--wait-for-topic': 'soon' is not a number of seconds"),
        (["--wait-for-topic", ""], "Invalid value for '--wait-for-topic': '' is not a number of seconds"),
        (["--coordinator", ""], f"{COORDINATOR_FLAG}: '' is not HOST:PORT"),
        (["--coordinator", "localhost:99999"], f"{COORDINATOR_FLAG}: 'localhost:99999' is not HOST:PORT (a port from"),
        (["--coordinator", "localhost"], f"{COORDINATOR_FLAG}: 'localhost' is not HOST:PORT"),
        (["--coordinator", ":50051"], f"{COORDINATOR_FLAG}: ':50051' is not HOST:PORT"),
        (["--coordinator", "http://c:50051"], f"{COORDINATOR_FLAG}: 'http://c:50051' is a URL: give the coordinator's"),
        (["--coordinator-retry-seconds", "nan"], "'--coordinator-retry-seconds': 'nan' is not between 0.1 and 86400"),
        (["--coordinator-retry-seconds", "0"], "'--coordinator-retry-seconds': '0' is not between 0.1 and 86400"),
        (["--coordinator-retry-seconds", "-inf"], "'--coordinator-retry-seconds': '-inf' is not between 0.1 and 8640"),
    ],
)
def test_bad_flags_are_refused_before_spark_starts(started: Started, flags: list[str], message: str) -> None:
    result = started.invoke(*flags)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert not started.calls
    started.session.stop.assert_not_called()


@pytest.mark.parametrize(
    "path",
    [
        lambda tmp: tmp / "missing-directory" / "spark.log",
        lambda tmp: tmp,
        lambda tmp: tmp / "${env:HOME}.log",
        lambda tmp: tmp / "a-file" / "spark.log",
    ],
    ids=["missing directory", "a directory", "a log4j look-up", "below a file"],
)
def test_a_spark_log_file_that_cannot_be_written_is_refused_before_anything(
    started: Started, tmp_path: Path, path: Callable[[Path], Path]
) -> None:
    (tmp_path / "a-file").write_text("")
    target = path(tmp_path)
    result = started.invoke("--spark-log-file", str(target))
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--spark-log-file'" in " ".join(result.output.split()), result.output
    assert not started.calls
    assert not target.is_file() or target == tmp_path


def test_spark_log_file_defaults_to_the_temporary_directory_and_the_console_at_debug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with (
        mock.patch.object(job_run, "spark_session") as spark_session,
        mock.patch.object(job_run, "start_job"),
        mock.patch.object(job_run, "wait_for_coordinator"),
        mock.patch.object(job_run, "wait_for_topics"),
        mock.patch.object(job, "configure_logging"),
        mock.patch.object(job, "set_worker_log_level"),
    ):
        result = CliRunner().invoke(job.app, [*REQUIRED, "--log-level", "debug"])
    assert result.exit_code == 0, result.output
    (master, spark_log), _ = spark_session.call_args
    assert master is None
    assert spark_log == SparkLog(tmp_path / "sink-writer-s.log", on_console=True)


@pytest.mark.parametrize("address", ["coordinator:50051", "10.0.0.7:1", "[::1]:50051", "dns:///c:50051", "unix:/s"])
def test_coordinator_addresses_grpc_takes_are_taken(started: Started, address: str) -> None:
    result = started.invoke("--coordinator", address)
    assert result.exit_code == 0, result.output
    assert started.sink.coordinator == address


def test_help_names_the_local_master_the_job_uses() -> None:
    shown = " ".join(CliRunner().invoke(job.app, ["--help"], env={"COLUMNS": "300"}).output.split())
    assert f"else {with_task_retries(job.DEFAULT_LOCAL_MASTER)} " in shown
    assert with_task_retries(job.DEFAULT_LOCAL_MASTER) == "local[*, 4]"


def test_help_shows_every_flags_type_and_default() -> None:
    shown = " ".join(CliRunner().invoke(job.app, ["--help"], env={"COLUMNS": "300"}).output.split())
    for flag in (
        "--target-file-size <size>",
        "--storage <key=value>",
        "--kafka-option <key=value>",
        "--max-offsets-per-trigger <int range> [x>=1]",
        "--available-now --no-available-now <bool>",
        "--wait-for-topic <seconds>",
        "--spark-log-file <file>",
    ):
        assert flag in shown, flag
    assert "[default: 134217728]" in shown
    assert "[default: no-available-now]" in shown


def test_kafka_settings_become_source_options() -> None:
    settings = KafkaSettings(
        "b1:9092,b2:9092",
        ("orders", "refunds"),
        starting_offsets="latest",
        max_offsets_per_trigger=5000,
        fail_on_data_loss=False,
        consumer_options={"security.protocol": "SSL"},
    )
    assert settings.source_options() == {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "subscribe": "orders,refunds",
        "startingOffsets": "latest",
        "failOnDataLoss": "false",
        "maxOffsetsPerTrigger": "5000",
        "kafka.security.protocol": "SSL",
    }


def test_spark_kafka_source_reads_committed_records_with_their_headers() -> None:
    settings = KafkaSettings("b:9092", ("orders",), source=KafkaSource.SPARK)
    assert settings.source_format == "kafka"
    assert settings.source_options() == {
        "kafka.bootstrap.servers": "b:9092",
        "subscribe": "orders",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    assert KafkaSettings("b:9092", ("orders",)).source_format == "sink_coordinator_kafka"


@pytest.mark.parametrize(
    ("kafka", "parse", "reads_ranges"),
    [
        (KafkaSettings("b:9092", ("orders",)), ParseSettings(schema_ddl="id BIGINT", evolve_schema=False), True),
        (KafkaSettings("b:9092", ("orders",)), ParseSettings(schema_ddl="id BIGINT"), False),
        (
            KafkaSettings("b:9092", ("orders",), source=KafkaSource.SPARK),
            ParseSettings(schema_ddl="id BIGINT", evolve_schema=False),
            False,
        ),
        (KafkaSettings("b:9092", ("orders",)), ParseSettings(record_format=RecordFormat.RAW), False),
        (
            KafkaSettings("b:9092", ("orders",)),
            ParseSettings(record_format=RecordFormat.AVRO, schema_registry_url="http://registry:8081"),
            True,
        ),
        (
            KafkaSettings("b:9092", ("orders",)),
            ParseSettings(
                schema_ddl="id BIGINT",
                evolve_schema=False,
                mutations=Mutations(MutationMode.UPSERT, ("id",)),
            ),
            False,
        ),
    ],
)
def test_the_tasks_read_offset_ranges_only_where_nothing_runs_in_spark_before_them(
    kafka: KafkaSettings, parse: ParseSettings, reads_ranges: bool
) -> None:
    """Only this project's source has a stream of ranges; JSON fields learned per batch, and an upsert stream's
    shuffle by key, need the records in Spark."""
    ranges = task_ranges(kafka, parse)
    assert (ranges is not None) == reads_ranges
    if ranges is not None:
        assert ranges == parse_options(kafka.source_options())


ID_SCHEMA = StructType([StructField("id", LongType())])


def test_a_parser_learning_json_fields_refuses_a_stream_of_ranges() -> None:
    ranges = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "orders"})
    with pytest.raises(ValueError, match=r"learning a batch's new JSON fields .* cannot be of offset ranges"):
        JsonBatchParser(ID_SCHEMA, evolve=True, ranges=ranges)
    assert JsonBatchParser(ID_SCHEMA, evolve=False, ranges=ranges).ranges == ranges


def test_the_job_and_the_source_start_at_the_same_offsets_by_default() -> None:
    """A new query of sink-writer (flag or settings left out) starts where the source alone does: earliest."""
    source_alone = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "orders"}).starting_offsets
    settings = KafkaSettings("b:9092", ("orders",))
    assert inspect.signature(job.main).parameters["starting_offsets"].default == settings.starting_offsets
    assert parse_options(settings.source_options()).starting_offsets == source_alone == "earliest"


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", "local[1, 4]"),
        ("local[2]", "local[2, 4]"),
        ("local[*]", "local[*, 4]"),
        ("local[2, 8]", "local[2, 8]"),
        ("spark://host:7077", "spark://host:7077"),
        ("yarn", "yarn"),
    ],
)
def test_local_masters_get_task_retries(master: str, expected: str) -> None:
    assert with_task_retries(master) == expected
    assert retries_tasks(expected)


def test_unknown_json_time_zone_is_refused() -> None:
    assert check_time_zone("Europe/Paris") == "Europe/Paris"
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        check_time_zone("Mars/Olympus")


@pytest.mark.parametrize(
    ("policy", "topic"),
    [(BadRecordPolicy.DEAD_LETTER, None), (BadRecordPolicy.NULL, "dead"), (BadRecordPolicy.FAIL, "d")],
)
def test_dead_letter_topic_goes_with_the_dead_letter_policy(policy: BadRecordPolicy, topic: str | None) -> None:
    with pytest.raises(ValueError, match="--dead-letter-topic is required with --on-bad-record dead-letter"):
        ParseSettings(on_bad_record=policy, dead_letter_topic=topic)


REGISTRY = ["--schema-registry-url", "http://registry:8081"]


def test_registry_formats_take_the_registry_and_its_client_options(started: Started) -> None:
    url = f"mock://{uuid.uuid4().hex}"
    order = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    registry_client(RegistrySettings.of(url)).register_schema("orders-value", Schema(json.dumps(order), "AVRO"))

    result = started.invoke(
        "--format", "avro", "--schema-registry-url", url, "--schema-registry-option", "timeout=5",
        "--schema-registry-option", "basic.auth.user.info=user:pa=ss", "--no-evolve-schema",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert started.parse.schema_registry_url == url
    assert started.parse.registry_settings().client_config() == {
        "url": url,
        "timeout": 5,
        "basic.auth.user.info": "user:pa=ss",
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--format", "avro"], "--format avro reads its schemas from a schema registry: pass its URL"),
        (REGISTRY, "--schema-registry-url: only with --format avro, protobuf or json-schema"),
        (["--subject", "s", "--decode-key"], "--subject, --decode-key: only with --format avro, protobuf or json"),
        (["--format", "protobuf", *REGISTRY, "--schema", "id BIGINT"], "--schema is for --format json"),
        (["--format", "avro", *REGISTRY, "--key-subject", "k"], "--key-subject names the subject of the keys"),
        (["--format", "avro", *REGISTRY, "--protobuf-message", "M"], "--protobuf-message is for --format protobuf"),
        (
            ["--format", "avro", *REGISTRY, "--schema-registry-option", "timeout=soon"],
            "schema registry option timeout='soon' is not a number",
        ),
        (
            ["--format", "avro", *REGISTRY, "--schema-registry-option", "colour=blue"],
            "bad schema registry settings for http://registry:8081: Unrecognized properties: colour",
        ),
        (["--format", "avro", "--schema-registry-url", "ftp://registry"], "Invalid url ftp://registry"),
        (
            ["--format", "json-schema", "--schema-registry-url", "mock://nothing-registered"],
            "subject orders-value is not in the schema registry at mock://nothing-registered",
        ),
        (
            ["--format", "avro", *REGISTRY, "--topic", "refunds"],
            "have one subject each (<topic>-value): name the one whose schema the table has (--subject)",
        ),
    ],
)
def test_bad_registry_flags_are_refused_before_spark_starts(started: Started, flags: list[str], message: str) -> None:
    result = started.invoke(*flags)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not started.calls


def test_an_unreachable_registry_fails_the_job_before_spark_starts(started: Started) -> None:
    url = f"http://user:secret@127.0.0.1:{free_port()}"
    result = started.invoke(
        "--format", "avro", "--schema-registry-url", url, "--schema-registry-option", "max.retries=0"
    )
    assert result.exit_code == ExitCode.UNREACHABLE
    assert "could not be reached for subject 'orders-value'" in result.output, result.output
    assert "secret" not in result.output
    assert not started.calls
    started.session.stop.assert_not_called()


def test_route_flags_become_the_sinks_routes(started: Started) -> None:
    result = started.invoke(
        "--route-by", "region", "--route", "eu=shop.eu", "--route", "us=shop.us", "--unrouted", "fail"
    )
    assert result.exit_code == 0, result.output
    assert started.sink.routes == Routes("region", {"eu": "shop.eu", "us": "shop.us"}, unrouted=Unrouted.FAIL)


def test_no_route_flags_no_fan_out(started: Started) -> None:
    assert started.invoke().exit_code == 0
    assert started.sink.routes is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--route", "eu=shop.eu"], "--route needs --route-by COLUMN"),
        (["--route-by", "region"], "--route-by region needs --route VALUE=TABLE (repeat) or --dynamic-routes"),
        (["--route-by", "r", "--dynamic-routes", "--route", "eu=shop.eu"], "--route and --dynamic-routes exclude"),
        (["--route-by", "r", "--route", "eu=orders"], "route 'eu': table identifier 'orders' must be"),
        (["--route-by", "r", "--route", "eu=shop.a", "--route", "eu=shop.b"], "route value 'eu' is given twice"),
        (["--route-by", "r", "--dynamic-routes", "--unrouted", "drop"], "'drop' is not one of 'default', 'fail'"),
    ],
)
def test_bad_route_flags_are_refused_before_spark_starts(started: Started, flags: list[str], message: str) -> None:
    result = started.invoke(*flags)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert not started.calls


def test_an_error_the_job_cannot_name_ends_in_one_line_that_names_spark_log(started: Started) -> None:
    with mock.patch.object(job_run, "start_job", side_effect=RuntimeError("disk on fire\n  at somewhere")):
        result = started.invoke()
    assert result.exit_code == ExitCode.FAILED
    last = result.output.splitlines()[-1]
    assert "RuntimeError: disk on fire at somewhere" in last and f"spark_log={started.spark_log}" in last
    assert "Traceback (most recent call last)" in started.spark_log.read_text()
    assert "Traceback" not in result.output


def test_a_failure_the_job_names_is_its_line_and_code_alone(started: Started) -> None:
    missing = JobFailure("topic 'orders' does not exist on Kafka at b:9092: create it", ExitCode.USAGE)
    with mock.patch.object(job_run, "wait_for_topics", side_effect=missing):
        result = started.invoke()
    assert result.exit_code == ExitCode.USAGE
    assert "topic 'orders' does not exist" in result.output.splitlines()[-1]
    assert "spark_log" not in result.output
    assert started.spark_log.read_text() == ""
    assert not started.calls
    started.session.stop.assert_not_called()
