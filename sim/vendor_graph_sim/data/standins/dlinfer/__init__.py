"""Stand-in dlinfer for vendor_graph tests (see sim/vendor_graph_sim/data/standins/README.md)."""
