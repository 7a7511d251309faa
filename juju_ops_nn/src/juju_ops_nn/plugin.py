"""Entry point of the nn pack."""

import juju

from juju_ops_nn import conv, pooling


@juju.hookimpl
def juju_rules():
    return [conv.rules, pooling.rules]
