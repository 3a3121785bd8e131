"""For operators, never imported by the step path: the ``vendor-graph`` command line, ``doctor`` and the self-
check.
"""
