"""The demo's ordered workload: bank accounts whose balance changes and orders that move
created -> paid -> shipped, interleaved across many accounts. The account id is the sharding key;
each account's events carry ``seq`` 0, 1, 2, ... in the order they must be handled."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

__all__ = ["EVENT_DDL", "notifications", "generate"]

ORDER_STATES = ("CREATED", "PAID", "SHIPPED")
EVENT_DDL = (
    "account STRING, seq LONG, kind STRING, amount LONG, balance LONG, order_id STRING, state STRING, born LONG"
)


def generate(total: int, accounts: int, chunk: int = 5_000, seed: int = 7) -> Iterator[list[dict]]:
    """Chunks of message dicts (key, tag, body) totalling ``total`` events."""
    rng = random.Random(seed)
    seq = [0] * accounts
    balance = [rng.randrange(0, 100_000) for _ in range(accounts)]
    open_order: list[tuple[str, int] | None] = [None] * accounts
    orders = 0
    produced = 0
    while produced < total:
        out = []
        for _ in range(min(chunk, total - produced)):
            a = rng.randrange(accounts)
            account = f"acct-{a:06d}"
            event = {"account": account, "seq": seq[a], "born": time.time_ns() // 1_000_000}
            if open_order[a] is not None and rng.random() < 0.5:
                order_id, state = open_order[a]
                event.update(kind="order", order_id=order_id, state=ORDER_STATES[state + 1])
                open_order[a] = (order_id, state + 1) if state + 1 < len(ORDER_STATES) - 1 else None
            elif rng.random() < 0.3:
                orders += 1
                order_id = f"ord-{orders:07d}"
                event.update(kind="order", order_id=order_id, state="CREATED")
                open_order[a] = (order_id, 0)
            else:
                amount = rng.choice((-30, 80, -120, 250, 1000, -45)) * 100
                balance[a] += amount
                event.update(kind="balance", amount=amount, balance=balance[a])
            seq[a] += 1
            out.append({"key": account, "tag": event["kind"].upper(), "body": json.dumps(event)})
        produced += len(out)
        yield out


def notifications(events):
    """The streaming transformation: one customer notification per event, keyed by account.

    A per-row projection: it keeps each queue's (and so each account's) order.
    """
    from pyspark.sql import functions as F

    e = F.from_json(F.col("body").cast("string"), EVENT_DDL)
    parsed = events.select(F.col("key").alias("account"), e.alias("e"))
    money = lambda c: F.format_number(c / 100, 2)  # noqa: E731 - amounts are in cents
    text = (
        F.when(F.col("e.kind") == "balance",
               F.concat(F.lit("Balance "), F.when(F.col("e.amount") >= 0, F.lit("+")).otherwise(F.lit("")),
                        money(F.col("e.amount")), F.lit(", now "), money(F.col("e.balance"))))
        .otherwise(F.concat(F.lit("Order "), F.col("e.order_id"), F.lit(" is "), F.col("e.state")))
    )
    body = F.to_json(F.struct(F.col("account"), F.col("e.seq").alias("seq"), text.alias("text"),
                              F.col("e.born").alias("event_born")))
    return parsed.select("account", body.alias("body"), F.upper(F.col("e.kind")).alias("tag"))
