"""The command line: `modular run`, `modular batch`, `inspect`, `families`, their argument types, what a run
prints and the memory plot.

May import every other part of modular; nothing in modular imports it.
"""
