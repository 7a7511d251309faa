"""Entry point of the Mojo kernels pack."""

import juju
from juju_kernels_mojo import (blas_library, blas_rules, fft_library, fft_rules, kernel_library,
                               lax_rules, linalg_library, linalg_rules, loop_rules,
                               native_programs, nn_rules, placement, primitives, program_kernels,
                               sequence_library, sequence_rules)


@juju.hookimpl
def juju_rules():
    return [primitives.rules, lax_rules.rules, nn_rules.rules, linalg_rules.rules, loop_rules.rules,
            sequence_rules.rules, blas_rules.rules, fft_rules.rules, program_kernels.rules]


@juju.hookimpl
def juju_kernel_libraries():
    return [kernel_library, linalg_library, sequence_library, blas_library, fft_library]


@juju.hookimpl
def juju_jaxpr_rewrites():
    return [placement.rewrite]


@juju.hookimpl
def juju_program_runners():
    return [native_programs.runner]
