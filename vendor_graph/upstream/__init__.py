"""What lmdeploy and dlinfer are: the lmdeploy releases supported and where their API moved, and the table of
upstream breakages.
"""
