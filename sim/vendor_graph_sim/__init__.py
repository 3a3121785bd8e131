"""Hardware-free testing tools for vendor_graph: the graph simulator (``vendor_graph_sim.device``)."""
