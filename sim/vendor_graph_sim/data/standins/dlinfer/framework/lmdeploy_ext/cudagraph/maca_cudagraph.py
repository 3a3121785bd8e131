from ._displace import displace

displace("maca")
