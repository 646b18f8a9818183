"""The pipeline: `ModularPipeline` and its call, loading components, saving, index files, replacement,
outputs and devices.

May import `modular.adapters`, `modular.framework` and the modules below them.
"""
