"""What the engine reports: the decision log (one device or several), the peer's record of moves read from
it, the error messages with the sizes that decided them, and each model's residency.

May import `offload.devices` and `offload.errors`.
"""
