"""Adapters on a pipeline's models: LoRA (files, checks, marks, saving plain weights), IP-Adapter, and the
exclusion of calls and changes of shared models.

May import `modular.framework`, `modular.families`, `modular.errors`, `components`.
"""
