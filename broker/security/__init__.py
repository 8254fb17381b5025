"""Access control of the broker: who a caller is (``guard``, from ``hashing``), what each user may
do (``acl``, kept in the ACL file), and what each RPC asks for (``rights``).

Off unless ``acl_file`` is set: then every call must carry an access key and secret, and is
checked against the rules of the file, re-read when it changes.
"""
