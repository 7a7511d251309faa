"""The pack's entry point: its rules and its kernel library."""

import juju
from juju_example_pack import kernel_library, rules


@juju.hookimpl
def juju_rules():
    return [rules]


@juju.hookimpl
def juju_kernel_libraries():
    return [kernel_library]
