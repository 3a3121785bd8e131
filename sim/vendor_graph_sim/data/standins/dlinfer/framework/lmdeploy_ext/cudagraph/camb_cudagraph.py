from ._displace import displace

displace("camb")
