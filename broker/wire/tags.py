"""Tag filter expressions, as in RocketMQ's subscriptions: ``"TagA || TagC"``; ``"*"`` or ``""``
matches every message (including untagged ones)."""

from __future__ import annotations

import re
from functools import lru_cache

from broker.wire.errors import BadTagExpressionError

__all__ = ["parse_tag_expression"]

_TAG = re.compile(r"^[A-Za-z0-9_.:\-]+$")


@lru_cache(maxsize=1024)
def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """The set of tags the expression accepts, or None for "every message"."""
    text = (expression or "").strip()
    if text in ("", "*"):
        return None
    tags = [part.strip() for part in text.split("||")]
    bad = [t for t in tags if not _TAG.match(t)]
    if bad:
        raise BadTagExpressionError(
            f"bad tag expression {expression!r}: {bad[0]!r} is not a tag; write tags separated by '||' "
            "(e.g. 'TagA || TagC'), or '*' for all"
        )
    return frozenset(tags)
