"""Stand-in dlinfer for vendor_graph tests (see tests/stubs/README.md)."""
