"""Entry point of the nn pack."""

import juju

from juju_ops_nn import conv, fused, pooling


@juju.hookimpl
def juju_rules():
    return [conv.rules, pooling.rules, fused.rules]


@juju.hookimpl
def juju_jaxpr_rewrites():
    return [fused.rewrite]
