"""Getting into lmdeploy and staying there: the patches and import hooks, a vendor profile's installation, the
worker autoload and watch, lifecycle resets and the lmdeploy/dlinfer bridges.
"""
