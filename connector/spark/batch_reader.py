"""The batch reader (``spark.read``): fixed per-queue ranges from starting to ending offsets.

Positions are resolved on the driver when Spark plans the read, so a bad offset or a missing
topic fails before any task runs. A batch read takes no queue locks and commits no offsets:
``consumerGroup`` only matters for ``startingOffsets='committed'``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from broker.wire.errors import InvalidOptionError
from connector.spark import metadata
from connector.spark.options import SourceOptions
from connector.spark.partitions import QueuePartition, read_partition
from connector.spark.schema import arrow_schema

__all__ = ["OrderlyMQBatchReader"]


class OrderlyMQBatchReader(DataSourceReader):
    """Reads ``[startingOffsets, endingOffsets)`` of every queue of the topics."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        with opts.connect() as conn:
            routes = metadata.describe_topics(conn, opts.topics)
            queues = metadata.all_queues(routes)
            start = metadata.resolve_positions(
                conn,
                opts.starting,
                queues,
                option=opts.starting.option_name,
                group=opts.consumer_group,
                fail_on_data_loss=opts.fail_on_data_loss,
            )
            ending_option = "endingTimestamp" if opts.ending.kind == "timestamp" else "endingOffsets"
            end = metadata.resolve_positions(conn, opts.ending, queues, option=ending_option, fail_on_data_loss=True)
        for ref in queues:
            if opts.ending.kind == "offsets" and end[ref] < start[ref]:
                topic, queue_id = ref
                raise InvalidOptionError(
                    f"option 'endingOffsets': queue {topic}/{queue_id} would end at {end[ref]}, before its start "
                    f"{start[ref]}: give an ending offset >= the starting offset"
                )
        partitions = []
        for ref in queues:
            if end[ref] > start[ref]:
                topic, queue_id = ref
                broker, addresses = metadata.placement(routes[topic], queue_id)
                partitions.append(QueuePartition(topic=topic, broker=broker, queue_id=queue_id, start=start[ref],
                                                 end=end[ref], addresses=addresses))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueuePartition):  # Spark's placeholder when there is nothing to read
            return iter(())
        return read_partition(self.options, partition, arrow_schema(self.schema))
