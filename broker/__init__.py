"""orderlymq broker: an ordered, durable message store served over gRPC.

``broker.wire`` and ``broker.proto`` are the wire layer shared with the client; the storage and
server modules are imported only by the broker process itself.
"""

__version__ = "0.1.0"
