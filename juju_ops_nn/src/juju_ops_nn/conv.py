"""conv_general_dilated (work in progress)."""

from juju import RuleSet

rules = RuleSet()
