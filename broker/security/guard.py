"""The broker's gatekeeper: authenticates each call's credentials and checks its rights against
the ACL file, which it re-reads when the file changes.

A secret is verified against its scrypt hash once; afterwards the call is recognised by a keyed
digest of (access key, secret) held in memory only, so an RPC costs a hash lookup, not a scrypt.
Decisions per (user, action, resource) are remembered likewise. Both memories are dropped when
the ACL file changes. Secrets are never logged nor put in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker.security.acl import ACTIONS, AclDocument, load_acl
from broker.security.hashing import verify_secret
from broker.security.rights import ANY_PUBLISH, DESCRIBE, required_rights
from broker.security.throttle import UNKNOWN_KEYS, FailureThrottle
from broker.wire.credentials import ACCESS_KEY_HEADER, SECRET_KEY_HEADER
from broker.wire.errors import InvalidOptionError, PermissionDeniedError, UnauthenticatedError
from broker.wire.file_watch import FileWatch

__all__ = ["AccessGuard"]

log = logging.getLogger(__name__)

_MEMORY_LIMIT = 10_000  # remembered credentials / decisions; forgotten all at once beyond it
_SHOWN_KEY_CHARS = 64  # an access key in an error is cut here (a fuzzer may send megabytes)
_NO_CREDENTIALS = (
    f"no credentials: this broker requires an access key and a secret key on every call (metadata "
    f"{ACCESS_KEY_HEADER} / {SECRET_KEY_HEADER}; client: credentials=Credentials(...), CLI: "
    "ORDERLYMQ_ACCESS_KEY / ORDERLYMQ_SECRET_KEY, Spark: options auth.accessKey / auth.secretKey)"
)


def _shown(access_key: str) -> str:
    return repr(access_key[:_SHOWN_KEY_CHARS] + ("..." if len(access_key) > _SHOWN_KEY_CHARS else ""))


def _credentials_of(metadata: Iterable[Any]) -> tuple[str, str]:
    key = secret = ""
    for item in metadata or ():
        name, value = item[0], item[1]
        if name == ACCESS_KEY_HEADER:
            key = value if isinstance(value, str) else ""
        elif name == SECRET_KEY_HEADER:
            secret = value if isinstance(value, str) else ""
    return key, secret


class AccessGuard:
    """Authentication and authorization of every call, from the ACL file at ``path``.

    Raises ``InvalidOptionError`` at construction when the file is missing or invalid; a later
    bad edit is logged and the last good rules stay in force.
    """

    def __init__(self, path: str, *, reload_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._throttle = FailureThrottle(clock)
        self._watch = FileWatch(path)
        self._acl = load_acl(path)
        self._interval = reload_interval_s
        self._clock = clock
        self._next_check = clock() + reload_interval_s
        self._reload_lock = threading.Lock()
        self._digest_key = os.urandom(32)
        self._verified: dict[bytes, str] = {}
        self._decisions: dict[tuple[str, str, str], bool] = {}

    @property
    def acl(self) -> AclDocument:
        """The rules in force, re-read first if the file changed (looked at once per interval)."""
        if self._clock() >= self._next_check:
            self._reload_if_changed()
        return self._acl

    def _reload_if_changed(self) -> None:
        if not self._reload_lock.acquire(blocking=False):
            return  # another thread is at it; its result applies to the next calls
        try:
            self._next_check = self._clock() + self._interval
            if not self._watch.changed():
                return
            path = self._watch.paths[0]
            try:
                acl = load_acl(path)
            except InvalidOptionError as exc:
                log.error("keeping the previous access rules: %s", exc)
                return
            self._acl, self._verified, self._decisions = acl, {}, {}
            log.info("ACL file %s reloaded: %d users, %d rules", path, len(acl.users), len(acl.rules))
        finally:
            self._reload_lock.release()

    # --- authentication ---

    def _digest(self, key: str, secret: str) -> bytes:
        return hmac.digest(self._digest_key, f"{key}\0{secret}".encode("utf-8", "surrogatepass"), hashlib.sha256)

    def recognise(self, metadata: Iterable[Any], host: str = "") -> str | None:
        """The user whose credentials were verified before, or None when a hash must be checked
        (``authenticate``). Raises ``UnauthenticatedError`` when no check could succeed, or when
        ``host`` (the caller's) failed too often with this key lately (``throttle``)."""
        key, secret = _credentials_of(metadata)
        acl = self.acl
        if not key or not secret:
            raise UnauthenticatedError(_NO_CREDENTIALS if not key else f"access key {_shown(key)} came without "
                                       f"its secret key (metadata {SECRET_KEY_HEADER})")
        if key not in acl.users:
            self._unknown_key(key, host)
        user = self._verified.get(self._digest(key, secret))
        if user is None:
            pause = self._throttle.pause_left(host, key)
            if pause > 0:
                raise UnauthenticatedError(f"too many wrong secret keys for access key {_shown(key)} from "
                                           f"{host or 'here'} lately: its secret is not checked for another "
                                           f"{pause:.1f}s")
        return user

    def _unknown_key(self, key: str, host: str) -> None:
        """Refuse an access key that is not in the file; guessing names from one host is paused
        as guessing secrets is (the errors tell an unknown key from a wrong secret)."""
        pause = self._throttle.pause_left(host, UNKNOWN_KEYS)
        if pause > 0:
            raise UnauthenticatedError(f"too many unknown access keys from {host or 'here'} lately: access keys are "
                                       f"not checked for another {pause:.1f}s")
        self._throttle.failed(host, UNKNOWN_KEYS)
        raise UnauthenticatedError(f"unknown access key {_shown(key)}: no such user in the broker's ACL file")

    def authenticate(self, metadata: Iterable[Any], host: str = "") -> str:
        """The user named by the call's credentials; ``UnauthenticatedError`` saying what is wrong.
        Costs one scrypt the first time a (key, secret) pair is seen: call it off the event loop."""
        user = self.recognise(metadata, host)
        if user is not None:
            return user
        key, secret = _credentials_of(metadata)
        acl = self._acl
        if not verify_secret(secret, acl.users.get(key, "")):
            self._throttle.failed(host, key)
            raise UnauthenticatedError(f"wrong secret key for access key {_shown(key)}")
        self._throttle.succeeded(host, key)
        if len(self._verified) >= _MEMORY_LIMIT:
            self._verified = {}
        self._verified[self._digest(key, secret)] = key
        return key

    # --- authorization ---

    def allows(self, user: str, action: str, resource: str) -> bool:
        acl = self.acl
        decision = self._decisions.get((user, action, resource))
        if decision is None:
            if action == DESCRIBE:
                decision = any(acl.allows(user, each, resource) for each in ACTIONS)
            elif not resource:
                decision = acl.may_ever(user, action)
            else:
                decision = acl.allows(user, action, resource)
            if len(self._decisions) >= _MEMORY_LIMIT:
                self._decisions = {}
            self._decisions[(user, action, resource)] = decision
        return decision

    def authorize(self, user: str, method: str, request: Any) -> None:
        """Raise ``PermissionDeniedError`` naming the user, action and resource ``method`` lacks."""
        rights = required_rights(method, request)
        if rights is None:
            raise PermissionDeniedError(f"user {user!r} may not call {method}: it is not covered by access control")
        for action, resource in rights:
            if not self.allows(user, action, resource):
                raise PermissionDeniedError(_denied(user, action, resource))

    def visible_topic(self, user: str, topic: str) -> bool:
        """Whether ``user`` has any right on ``topic`` (what ``ListTopics`` shows them)."""
        return self.allows(user, DESCRIBE, f"topic:{topic}")


def _denied(user: str, action: str, resource: str) -> str:
    if (action, resource) == ANY_PUBLISH:
        return f"user {user!r} may not publish on any topic, so may not use transactions"
    if action == DESCRIBE:
        return f"user {user!r} has no right on {resource} (publish, subscribe or admin), so may not see its route"
    return (f"user {user!r} may not {action} on {resource}: an administrator can grant it with "
            f"`orderlymq-broker acl allow {user} {action} {resource}`")
