"""SmolVLA as plain modules: built from checkpoint weights, calling ops resolved by the dispatch table.

Modules know nothing of caches, phases or graphs: they take tensors and return tensors.
"""
