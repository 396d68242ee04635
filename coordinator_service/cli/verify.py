"""`sink-coordinator verify SINK`: the admin API's POST /api/v1/sinks/{sink}/verify from the command line, against the
metastore and the catalog (whether or not a coordinator runs); --json prints the API's answer, byte for byte the
same model. Exits 1 when a fault was found, 2 on a refused flag."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from coordinator_service.cli import _operations, app
from coordinator_service.cli.flags import METASTORE, reaching_metastore, refuse, with_settings
from coordinator_service.contract.errors import CoordinatorError, InvalidArgument, SchemaNotCurrent
from coordinator_service.contract.flag_values import KEY_VALUE, KeyValue, parse_key_value
from coordinator_service.settings import Settings

if TYPE_CHECKING:
    from coordinator_service.admin.verification_schemas import VerificationResponse
    from coordinator_service.engine.verification.topic_offsets import KafkaAccess


@app.command()
@with_settings(*METASTORE, "catalog_name", "catalog", "admin_lock_timeout_seconds")
def verify(
    settings: Settings,
    sink: Annotated[str, typer.Argument(help="The sink to verify.", metavar="SINK")],
    incremental: Annotated[
        bool, typer.Option(help="Only what came after the last verification of each table (the log remembers it).")
    ] = False,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option(help="Kafka's bootstrap servers: every offset the topics still hold must be in a live row."),
    ] = None,
    kafka_option: Annotated[
        list[KeyValue] | None,
        typer.Option(
            help="A librdkafka setting for reaching Kafka (security.protocol=SASL_SSL), repeatable.",
            parser=parse_key_value,
            metavar=KEY_VALUE,
        ),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print the admin API's answer (JSON).")] = False,
) -> None:
    """Prove that the sink's tables hold exactly what its topics held in the committed range: the epochs' offset
    ranges and the snapshots (shallow), the live rows' Kafka positions and keys (deep), and with
    --bootstrap-servers the topics' offsets. Records the outcome in the log, as the admin API's POST
    /api/v1/sinks/{sink}/verify does; reads and changes no table. Exits 1 when a fault was found."""
    from coordinator_service.admin.verification_schemas import VerifyRequest
    from coordinator_service.runtime import metastore_url

    options = {option.key: option.value for option in kafka_option or []}
    if kafka_option and len(options) != len(kafka_option):
        refuse("cannot verify", ValueError("a --kafka-option is given twice"), code=2)
    try:
        request = VerifyRequest(incremental=incremental, bootstrap_servers=bootstrap_servers, kafka_options=options)
        kafka = request.kafka()
    except (ValueError, InvalidArgument) as error:
        refuse("cannot verify", error, code=2)
    url, _ = metastore_url(settings)
    try:
        with reaching_metastore(url):
            answer = asyncio.run(_verify(settings, sink, request.incremental, kafka))
    except CoordinatorError as error:
        refuse("cannot verify", error, code=2 if isinstance(error, InvalidArgument) else 1)
    except SchemaNotCurrent as error:
        refuse("cannot verify", error)
    output = Console(soft_wrap=True)
    if json:
        output.print_json(answer.model_dump_json())
    else:
        output.print("\n".join(_summary(answer)), markup=False, highlight=False)
    if not answer.ok:
        raise typer.Exit(1)


async def _verify(settings: Settings, sink: str, incremental: bool, kafka: KafkaAccess | None) -> VerificationResponse:
    from coordinator_service.admin.verification_schemas import VerificationResponse

    async with _operations(settings) as (operations, _):
        return VerificationResponse.of(await operations.verify_sink(sink, kafka, incremental))


def _summary(answer: VerificationResponse) -> list[str]:
    lines = [f"sink {answer.sink}: {'verified' if answer.ok else 'FAULTS FOUND'} up to epoch {answer.verified_epoch}"]
    for table in answer.tables:
        checks = ["shallow"] + (["deep"] if table.deep else []) + (["kafka"] if table.kafka else [])
        lines.append(
            f"  {table.table}: {'ok' if table.ok else 'failed'} ({', '.join(checks)}; {table.rows_read} rows, "
            f"{table.files_read} files read)"
        )
        lines.extend(f"    {fault.kind} epoch {fault.epoch}: {fault.detail}" for fault in table.faults)
        lines.extend(f"    note: {note}" for note in table.notes)
    return lines
