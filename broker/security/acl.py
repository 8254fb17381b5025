"""The ACL file: users (access key -> hashed secret) and allow / deny rules, as TOML.

::

    [users.alice]
    secret_hash = "scrypt$16384$8$1$..."

    [[rules]]
    user = "alice"                  # an access key, or "*" for every user
    effect = "allow"                # or "deny"; a matching deny beats any allow
    actions = ["publish", "subscribe"]
    resources = ["topic:orders-*", "group:billing"]

Resources are ``topic:<glob>``, ``group:<glob>`` or ``broker`` (broker-wide listings), globs as
in ``fnmatch`` (``*``, ``?``, ``[seq]``), case-sensitive. The ``replicate`` action (a slave
copying its master: every topic, offset and transaction) applies to ``broker`` only. Nothing is
allowed unless a rule allows it. Pure data and file I/O, no server: the broker reads it (``guard``), the CLI edits it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path

from broker.wire.errors import InvalidOptionError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["ACTIONS", "EFFECTS", "REPLICATE", "AclDocument", "Rule", "load_acl", "save_acl"]

ACTIONS = ("publish", "subscribe", "admin", "replicate")
#: The action of a broker group's slaves on their master's Replicate stream.
REPLICATE = "replicate"
EFFECTS = ("allow", "deny")
ANY_USER = "*"
BROKER_RESOURCE = "broker"
_RESOURCE_KINDS = ("topic:", "group:")


def _check_resource(resource: str) -> str:
    if resource == BROKER_RESOURCE or (resource.startswith(_RESOURCE_KINDS) and resource.split(":", 1)[1]):
        return resource
    raise InvalidOptionError(f"resource {resource!r} must be topic:<pattern>, group:<pattern> or {BROKER_RESOURCE!r}")


@dataclass(frozen=True)
class Rule:
    """Allow or deny ``actions`` on ``resources`` to ``user`` (``*``: everyone)."""

    user: str
    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.user, str) or not self.user:
            raise InvalidOptionError(f"rule user must be an access key or '*', got {self.user!r}")
        if self.effect not in EFFECTS:
            raise InvalidOptionError(f"rule effect must be allow or deny, got {self.effect!r}")
        bad = [a for a in self.actions if a not in ACTIONS]
        if bad or not self.actions:
            raise InvalidOptionError(f"rule actions must be among {', '.join(ACTIONS)}, got {list(self.actions)!r}")
        if not self.resources:
            raise InvalidOptionError("a rule needs at least one resource")
        for resource in self.resources:
            _check_resource(resource)
        if REPLICATE in self.actions and set(self.resources) != {BROKER_RESOURCE}:
            raise InvalidOptionError(f"the {REPLICATE} action applies to the resource {BROKER_RESOURCE!r} only "
                                     f"(a slave copies the whole broker), got {list(self.resources)!r}")

    def matches(self, user: str, action: str, resource: str) -> bool:
        return (self.user in (user, ANY_USER) and action in self.actions
                and any(fnmatchcase(resource, pattern) for pattern in self.resources))

    def describe(self) -> str:
        return f"{self.effect} {self.user} {','.join(self.actions)} on {' '.join(self.resources)}"


@dataclass(frozen=True)
class AclDocument:
    """Users (access key -> secret hash) and rules; ``allows`` is the one decision."""

    users: dict[str, str] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()

    def allows(self, user: str, action: str, resource: str) -> bool:
        """Whether ``user`` may do ``action`` on ``resource``: some allow matches and no deny does."""
        matching = [rule.effect for rule in self.rules if rule.matches(user, action, resource)]
        return "allow" in matching and "deny" not in matching

    def may_ever(self, user: str, action: str) -> bool:
        """Whether some rule allows ``user`` ``action`` on anything at all (for calls that name no
        resource, like the transaction RPCs)."""
        return any(rule.effect == "allow" and rule.user in (user, ANY_USER) and action in rule.actions
                   for rule in self.rules)

    def with_user(self, access_key: str, secret_hash: str) -> AclDocument:
        return replace(self, users={**self.users, access_key: secret_hash})

    def without_user(self, access_key: str) -> AclDocument:
        if access_key not in self.users:
            raise InvalidOptionError(f"no user {access_key!r} in the ACL file")
        users = {k: v for k, v in self.users.items() if k != access_key}
        return replace(self, users=users, rules=tuple(r for r in self.rules if r.user != access_key))

    def with_rule(self, rule: Rule) -> AclDocument:
        return self if rule in self.rules else replace(self, rules=(*self.rules, rule))

    def without_rule(self, rule: Rule) -> AclDocument:
        if rule not in self.rules:
            raise InvalidOptionError(f"no rule '{rule.describe()}' in the ACL file")
        return replace(self, rules=tuple(r for r in self.rules if r != rule))


def _parse(document: dict) -> AclDocument:
    extra = sorted(set(document) - {"users", "rules"})
    if extra:
        raise InvalidOptionError(f"unknown top-level key {extra[0]!r}; the ACL file has [users.<key>] and [[rules]]")
    users = {}
    for key, entry in document.get("users", {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("secret_hash"), str):
            raise InvalidOptionError(f"user {key!r} needs secret_hash = \"scrypt$...\" (see `orderlymq-broker acl`)")
        users[key] = entry["secret_hash"]
    rules = []
    for number, entry in enumerate(document.get("rules", []), 1):
        if not isinstance(entry, dict):
            raise InvalidOptionError(f"rule {number} must be a table")
        try:
            rules.append(Rule(entry.get("user"), entry.get("effect", "allow"), tuple(entry.get("actions", ())),
                              tuple(entry.get("resources", ()))))
        except (InvalidOptionError, TypeError) as exc:
            raise InvalidOptionError(f"rule {number}: {exc}") from None
    return AclDocument(users, tuple(rules))


def load_acl(path: str | os.PathLike[str]) -> AclDocument:
    """Read and check an ACL file; ``InvalidOptionError`` naming the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
        return _parse(document)
    except FileNotFoundError:
        raise InvalidOptionError(f"ACL file {path} does not exist (create it with `orderlymq-broker acl`)") from None
    except OSError as exc:
        raise InvalidOptionError(f"ACL file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, InvalidOptionError, AttributeError) as exc:
        raise InvalidOptionError(f"ACL file {path}: {exc}") from None


def _string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def _render(acl: AclDocument) -> str:
    lines = ["# orderlymq ACL: edit with `orderlymq-broker acl ...`; the broker re-reads it when it changes.", ""]
    for key, secret_hash in sorted(acl.users.items()):
        lines += [f"[users.{_string(key)}]", f"secret_hash = {_string(secret_hash)}", ""]
    for rule in acl.rules:
        lines += ["[[rules]]", f"user = {_string(rule.user)}", f"effect = {_string(rule.effect)}",
                  f"actions = [{', '.join(map(_string, rule.actions))}]",
                  f"resources = [{', '.join(map(_string, rule.resources))}]", ""]
    return "\n".join(lines)


def save_acl(path: str | os.PathLike[str], acl: AclDocument) -> None:
    """Replace the file atomically (a reader sees the old or the new one), readable by its owner only."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp creates it with mode 0600
            f.write(_render(acl))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
