# juju-kernels-mojo: every @register in this package is found by MAX.
