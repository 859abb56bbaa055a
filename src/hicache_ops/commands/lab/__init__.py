"""Several hosts on one machine: network namespaces, a Mooncake master and `hicache serve`
instances on their own addresses, and the cross-host faults of docs/mooncake.md#several-hosts.

up.py, down.py, status.py and fault.py are the `hicache lab` verbs; topology.py creates the
namespaces and links, processes.py starts and stops what runs in them, state.py records both.
"""
