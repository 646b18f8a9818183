"""Where each model's weights are: the residency ledger, moving tensors with their host copies, pinned models
and the count of structure changes.

May import `offload.devices`, `offload.strategies`, `offload.records` and `offload.errors`.
"""
