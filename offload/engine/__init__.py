"""The engine and its hook: attaching models, one hooked call, placement with threads waiting for room,
the fit checks, and replaying a run through another strategy.

May import every other part of offload; nothing imports it but the package's public face.
"""
