# The example pack's Mojo package; every @register in it is found.
