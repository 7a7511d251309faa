# juju-kernels-mojo's FFT kernels (fft.mojo): every @register in this package is found by MAX.
