"""Entry point of the Mojo kernels pack (work in progress)."""

import juju


@juju.hookimpl
def juju_rules():
    return []
