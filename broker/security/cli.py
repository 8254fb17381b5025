"""``orderlymq-broker acl ...``: manage the users and rules of a broker's ACL file.

The file is the one source of truth and the broker re-reads it when it changes, so an edit here
applies to a running broker within a second, and no admin RPC (with its own bootstrap and
lock-out problems) is needed: whoever may write the broker's files is its administrator.
Secrets are generated here and printed once, or read from stdin; never taken as an argument,
which other users of the machine could read in the process list.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from broker.security.acl import ACTIONS, AclDocument, Rule, load_acl, save_acl
from broker.security.hashing import hash_secret
from broker.wire.credentials import Credentials
from broker.wire.errors import InvalidOptionError

__all__ = ["main"]

ACL_FILE_ENV = "ORDERLYMQ_ACL_FILE"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orderlymq-broker acl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, default=os.environ.get(ACL_FILE_ENV),
                        help=f"the broker's acl_file (default ${ACL_FILE_ENV})")
    commands = parser.add_subparsers(dest="command", required=True)
    user = commands.add_parser("user", help="add, remove or list users").add_subparsers(dest="user_command",
                                                                                         required=True)
    add = user.add_parser("add", help="add a user (or give it a new secret); prints a generated secret once")
    add.add_argument("access_key")
    add.add_argument("--secret-stdin", action="store_true", help="read the secret from stdin instead")
    remove = user.add_parser("remove", help="remove a user and its rules")
    remove.add_argument("access_key")
    user.add_parser("list", help="list the users")
    for effect in ("allow", "deny"):
        rule = commands.add_parser(effect, help=f"{effect} actions on resources to a user ('*': everyone)")
        rule.add_argument("user")
        rule.add_argument("actions", help=f"comma-separated: {', '.join(ACTIONS)}")
        rule.add_argument("resources", nargs="+", help="topic:<glob>, group:<glob> or broker")
    commands.add_parser("list", help="list users and numbered rules")
    revoke = commands.add_parser("revoke", help="remove rule number N (as `list` shows it)")
    revoke.add_argument("number", type=int)
    return parser


def _load(path: Path, *, create: bool = False) -> AclDocument:
    if create and not path.exists():
        return AclDocument()
    return load_acl(path)


def _add_user(path: Path, access_key: str, from_stdin: bool) -> None:
    secret = sys.stdin.readline().rstrip("\n") if from_stdin else secrets.token_urlsafe(32)
    Credentials(access_key, secret)  # the same checks a client makes
    save_acl(path, _load(path, create=True).with_user(access_key, hash_secret(secret)))
    if not from_stdin:
        print(f"user {access_key} added; its secret key (shown only now):\n{secret}")
    else:
        print(f"user {access_key} added")


def _list(acl: AclDocument) -> None:
    print("users:", ", ".join(sorted(acl.users)) or "(none)")
    for number, rule in enumerate(acl.rules, 1):
        print(f"{number:3d}. {rule.describe()}")


def _run(args: argparse.Namespace) -> None:
    path = args.file
    if args.command == "user":
        if args.user_command == "add":
            _add_user(path, args.access_key, args.secret_stdin)
        elif args.user_command == "remove":
            save_acl(path, _load(path).without_user(args.access_key))
        else:
            print("\n".join(sorted(_load(path).users)))
    elif args.command in ("allow", "deny"):
        rule = Rule(args.user, args.command, tuple(a.strip() for a in args.actions.split(",")), tuple(args.resources))
        save_acl(path, _load(path).with_rule(rule))
    elif args.command == "revoke":
        acl = _load(path)
        if not 1 <= args.number <= len(acl.rules):
            raise InvalidOptionError(f"no rule {args.number}: there are {len(acl.rules)} (see `acl list`)")
        save_acl(path, acl.without_rule(acl.rules[args.number - 1]))
    else:
        _list(_load(path))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.file is None:
        print(f"orderlymq-broker acl: give --file or set {ACL_FILE_ENV}", file=sys.stderr)
        return 2
    try:
        _run(args)
    except (InvalidOptionError, OSError) as exc:
        print(f"orderlymq-broker acl: {exc}", file=sys.stderr)
        return 1
    return 0
