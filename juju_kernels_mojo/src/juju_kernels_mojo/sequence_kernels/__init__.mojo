# juju-kernels-mojo's sequence kernels (sort, top_k, cumulative reductions,
# scatter, concatenate): every @register in this package is found by MAX.
