"""Access control of the broker: who a caller is (``guard``, from ``hashing``, slowing guessing
down with ``throttle``), what each user may do (``acl``, kept in the ACL file), and what each RPC
asks for (``rights``); and its TLS certificate (``certificates``). The ACL file and the
certificate files are picked up again when they change (``watch``).

Off unless ``acl_file`` is set: then every call must carry an access key and secret, and is
checked against the rules of the file, re-read when it changes.
"""
