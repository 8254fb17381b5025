"""orderlymq connector: the Python client (``connector.client``) and the Spark data source
``orderlymq`` (``connector.spark``). Imports only the wire layer of ``broker``."""

import os

# grpcio 1.81 and later restart their epoll poller thread in a child process right after fork(). A
# child that closes inherited descriptors before its exec (``subprocess`` with a ``preexec_fn``, as
# PySpark starts its JVM) then at times aborts on the closed epoll descriptor (grpc/grpc#43055): a
# notebook that used a client before it started Spark failed with JAVA_GATEWAY_EXITED (one fork and
# exec in about 70 aborted here). The "poll" strategy, the one gRPC's fork support documents, has
# no such descriptor. gRPC reads it when first imported (by the client's modules, after this).
# A strategy the user chose is kept.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
