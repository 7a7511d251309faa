"""Static and donated arguments: `static_argnums`/`static_argnames` and
`donate_argnums`/`donate_argnames` resolved and checked against the
function's signature, with jax.jit's messages."""

from __future__ import annotations

import inspect


def resolve_statics(fun, static_argnums, static_argnames, kind: str = "static"):
    """`juju.jit`'s static arguments as (positions, names), each option
    resolved against `fun`'s signature as `jax.jit` does: an int or a str
    stands for a one-element tuple, negative positions count from the end,
    and a name of a positional parameter adds its position (and back).
    Raises jax.jit's TypeError/ValueError for the same mistakes. `kind`
    "donate" resolves `donate_argnums`/`donate_argnames` the same way."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    static_argnums, static_argnames = tuple(static_argnums or ()), tuple(static_argnames or ())
    for n in static_argnums:
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"juju.jit: {kind}_argnums must be ints, got {n!r}")
    for n in static_argnames:
        if not isinstance(n, str):
            raise TypeError(f"juju.jit: {kind}_argnames must be strings, got {n!r}")
    nums, names = set(static_argnums), set(static_argnames)
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # some builtins: no check, as in jax
        signature = None
    params = list(signature.parameters.values()) if signature is not None else []
    if signature is not None:
        _validate_argnums(params, static_argnums, f"{kind}_argnums")
        _validate_argnames(params, static_argnames, f"{kind}_argnames")
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    resolved = set()
    for n in nums:
        if n < 0:
            if not positional:
                raise ValueError(f"negative {kind}_argnums need an inspectable signature")
            n += len(positional)
        resolved.add(n)
        if 0 <= n < len(positional) and positional[n].kind is not positional[n].POSITIONAL_ONLY:
            names.add(positional[n].name)
    for i, p in enumerate(positional):
        if p.name in names:
            resolved.add(i)
    return frozenset(resolved), frozenset(names)


def resolve_donation(fun, donate_argnums, donate_argnames, statics):
    """(positions, names) of the donated arguments, resolved as
    `resolve_statics` resolves static ones; jax's ValueError where one is
    also static (`statics`: `resolve_statics`' result)."""
    positions, names = resolve_statics(fun, donate_argnums, donate_argnames, "donate")
    static_positions, static_names = statics
    if both := set(names & static_names):
        raise ValueError("static_argnames and donate_argnames cannot intersect. Argument "
                         f"names {both} appear in both static_argnames and donate_argnames")
    if positions & static_positions:
        raise ValueError(f"`static_argnums` {sorted(static_positions)} and "
                         f"`donate_argnums` {sorted(positions)} cannot intersect.")
    return positions, names


# jax.jit's checks and messages (jax/_src/api_util.py), so that code moving
# between jax.jit and juju.jit fails the same way.


def _validate_argnums(params, argnums, option: str) -> None:
    if any(p.kind is p.VAR_POSITIONAL for p in params):  # *args: any index
        return
    n_positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if argnums and (-min(argnums) > n_positional or max(argnums) >= n_positional):
        raise ValueError(f"Jitted function has {option}={argnums}, "
                         f"but only accepts {n_positional} positional arguments.")


def _validate_argnames(params, argnames, option: str) -> None:
    positional_only = {p.name for p in params
                       if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
    if invalid := positional_only & set(argnames):
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         f"in {option}. These are positional-only")
    if any(p.kind is p.VAR_KEYWORD for p in params):  # **kwargs: any name
        return
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if invalid := set(argnames) - keywords:
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         f"in {option}. Function does not take these args.")
