"""The block framework: declarations (params), block kinds and their composition, the walk of steps,
planning, state, type checks and docs.

May import `modular.errors` and `components`; a block's `init_pipeline` and `from_pretrained` reach up by deferred imports.
"""
