"""The key-tagging Kafka source's batches (spark_writer.mutations.keyed_source): what Spark checks them against, and
the key texts stage 2's decoder gives (null for a record that does not fit)."""

from __future__ import annotations

import pickle

from pyspark import cloudpickle
from pyspark.sql.pandas.types import to_arrow_schema

from spark_writer.kafka.options import SOURCE_NAME
from spark_writer.mutations.decoding import MutationDecoder
from spark_writer.mutations.keyed_source import KEYED_KAFKA_SCHEMA, KeyTaggingReader, key_tagging_source, tagged
from spark_writer.mutations.modes import MutationMode, Mutations
from spark_writer.mutations.tasks import SHUFFLE_KEY
from tests.unit.test_mutation_decoding import UPSERT, json_parser, kafka


def test_a_tagged_batch_is_what_spark_expects_of_the_source() -> None:
    decoder = json_parser(UPSERT).decoding.decoder
    assert isinstance(decoder, MutationDecoder)
    batch = tagged(kafka([({"id": 1}, {"id": 1, "name": "a"})]), decoder)
    assert batch.schema.equals(to_arrow_schema(KEYED_KAFKA_SCHEMA, timezone="UTC"))


def test_each_record_is_tagged_with_its_keys_text_and_a_misfit_with_none() -> None:
    keyed = Mutations(MutationMode.UPSERT, ("id", "name"))
    decoder = json_parser(keyed).decoding.decoder
    assert isinstance(decoder, MutationDecoder)
    records = kafka(
        [
            ({"id": 1, "name": "a"}, {"id": 1, "name": "a"}),
            ({"id": 2, "name": "b"}, None),  # a tombstone: its message key's
            ({"id": 1, "name": "a"}, {"id": 1, "name": None}),  # a key with a null column does not fit
            (None, b"not json"),
            ({"id": 1, "name": "a"}, {"id": 1, "name": "a", "op": "x"}),
        ]
    )
    texts = tagged(records, decoder).column(SHUFFLE_KEY).to_pylist()
    assert texts == decoder.key_texts(records.column("value"), records.column("key")).to_pylist()
    first, tombstone, null_column, bad, again = texts
    assert first == again and first is not None and tombstone is not None and first != tombstone
    assert null_column is None and bad is None


def test_a_source_travels_with_its_decoder_and_each_has_a_name_of_its_own() -> None:
    """Spark ships the class to the Python process that plans the stream: it arrives with the stream's decoder."""
    decoder = json_parser(UPSERT).decoding.decoder
    assert isinstance(decoder, MutationDecoder)
    source = key_tagging_source(decoder)
    assert source.name() != key_tagging_source(decoder).name()
    assert source.name().startswith(SOURCE_NAME)
    shipped = pickle.loads(cloudpickle.dumps(source))
    assert shipped.name() == source.name() and shipped.decoder == decoder
    reader = shipped({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}).streamReader(KEYED_KAFKA_SCHEMA)
    assert isinstance(reader, KeyTaggingReader)
    assert shipped({}).schema() == KEYED_KAFKA_SCHEMA
