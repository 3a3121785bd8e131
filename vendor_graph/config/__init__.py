"""What the user tells vendor_graph: the VENDOR_GRAPH_* variables, the values public functions accept, and the
files a user names.
"""
