"""The host tier: host copies within a byte budget (split between devices), with the disk copies and
spill files behind it.

May import `offload.weights` and everything below it (not `offload.partial` or `offload.engine`).
"""
