"""Devices and what they hold: memory probes (real, simulated, budgeted), the choice and list of devices,
the simulated clock, byte units and module sizes.

Imports nothing from the rest of offload but `offload.errors`.
"""
