"""The error hierarchy users catch; see ``broker.wire.errors`` for the tree and its gRPC mapping."""

from broker.wire.errors import *  # noqa: F403
from broker.wire.errors import __all__  # noqa: F401
