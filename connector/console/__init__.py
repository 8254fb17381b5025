"""``orderlymq console``: a read-only web console of a broker (topics, queues, groups and their lag,
lock holders, open transactions, health) with live plots of lag and throughput.

Built on the client's ``Admin`` only, like the command line; served by the standard library's
``ThreadingHTTPServer``, with a page of its own HTML, CSS and script (no external resources).
"""

from connector.console.server import ConsoleServer

__all__ = ["ConsoleServer"]
