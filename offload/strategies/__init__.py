"""Eviction strategies: the protocol, the default (next use), LRU, the peer's rule, watermarks, peer
strategies adapted, and the execution plan they read.

May import `offload.devices` and `offload.errors`.
"""
