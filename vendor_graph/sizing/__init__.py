"""Which batch sizes get a graph: bucketing policies, sizes fitted to a recorded workload, and the graph memory
kept out of the KV cache.
"""
