"""Entry point of the nn pack."""

import juju

from juju_ops_nn import conv, fused, materialize, pooling


@juju.hookimpl
def juju_rules():
    return [conv.rules, pooling.rules, fused.rules, materialize.rules]


@juju.hookimpl
def juju_jaxpr_rewrites():
    return [fused.rewrite, materialize.rewrite]
