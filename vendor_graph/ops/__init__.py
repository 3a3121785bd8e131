"""For operators, never imported by the step path: the ``vendor-graph`` command line and its commands, ``doctor``,
the self-check, and the reports (summaries and the stats file) that activation arms.
"""
