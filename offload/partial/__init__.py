"""Beyond whole models: weight groups, streaming a model partly resident, shrinking a victim to a prefix,
and prefetching the next model.

May import `offload.weights` and everything below it.
"""
