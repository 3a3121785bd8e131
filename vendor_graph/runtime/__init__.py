"""What runs every decode step: the step policy and its graph key, the stale-graph guard, the shadow check,
capture failures and rank agreement, lmdeploy's adopted CUDA runner, and the counters.
"""
