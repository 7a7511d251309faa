"""Static arguments: `static_argnums` and `static_argnames` resolved and
checked against the function's signature, with jax.jit's messages."""

from __future__ import annotations

import inspect


def resolve_statics(fun, static_argnums, static_argnames):
    """`juju.jit`'s static arguments as (positions, names), each option
    resolved against `fun`'s signature as `jax.jit` does: an int or a str
    stands for a one-element tuple, negative positions count from the end,
    and a name of a positional parameter adds its position (and back).
    Raises jax.jit's TypeError/ValueError for the same mistakes."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    static_argnums, static_argnames = tuple(static_argnums or ()), tuple(static_argnames or ())
    for n in static_argnums:
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"juju.jit: static_argnums must be ints, got {n!r}")
    for n in static_argnames:
        if not isinstance(n, str):
            raise TypeError(f"juju.jit: static_argnames must be strings, got {n!r}")
    nums, names = set(static_argnums), set(static_argnames)
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # some builtins: no check, as in jax
        signature = None
    params = list(signature.parameters.values()) if signature is not None else []
    if signature is not None:
        _validate_argnums(params, static_argnums)
        _validate_argnames(params, static_argnames)
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    resolved = set()
    for n in nums:
        if n < 0:
            if not positional:
                raise ValueError("negative static_argnums need an inspectable signature")
            n += len(positional)
        resolved.add(n)
        if 0 <= n < len(positional) and positional[n].kind is not positional[n].POSITIONAL_ONLY:
            names.add(positional[n].name)
    for i, p in enumerate(positional):
        if p.name in names:
            resolved.add(i)
    return frozenset(resolved), frozenset(names)


# jax.jit's checks and messages (jax/_src/api_util.py), so that code moving
# between jax.jit and juju.jit fails the same way.


def _validate_argnums(params, argnums) -> None:
    if any(p.kind is p.VAR_POSITIONAL for p in params):  # *args: any index
        return
    n_positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if argnums and (-min(argnums) > n_positional or max(argnums) >= n_positional):
        raise ValueError(f"Jitted function has static_argnums={argnums}, "
                         f"but only accepts {n_positional} positional arguments.")


def _validate_argnames(params, argnames) -> None:
    positional_only = {p.name for p in params
                       if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
    if invalid := positional_only & set(argnames):
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         "in static_argnames. These are positional-only")
    if any(p.kind is p.VAR_KEYWORD for p in params):  # **kwargs: any name
        return
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if invalid := set(argnames) - keywords:
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         "in static_argnames. Function does not take these args.")
