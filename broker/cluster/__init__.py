"""Broker groups: one master and its slaves, ZooKeeper as the control plane (docs/cluster.md).

::

    control.py      ZooKeeper nodes of a group: membership, the master's election, epoch, sync-state set
    epochs.py       where each master's term starts per queue; what a rejoining broker cuts
    replication.py  the master's side: slaves' fetches, sync acknowledgements, the sync-state set
    follower.py     the slave's side: copy the master of one epoch
    txnlog.py       the transaction table's changes, recorded by the master and replayed by slaves
    topics.py       the cluster's topics in ZooKeeper: which group holds each queue (routes)
    topic_keeper.py a master's local part of those topics; refusing queues of other groups
    node.py         the broker's role and every change of it
    gate.py         only the master serves clients
    zookeeper.py    run a local ZooKeeper server (tests, development)

None of it is imported by a broker without the ``zookeeper`` setting.
"""
