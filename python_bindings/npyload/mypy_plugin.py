"""A mypy plugin that makes mypy name the wrong argument of ``Loader(...)``.

Enable it in mypy's configuration; it changes nothing else. In mypy.ini or
setup.cfg::

    [mypy]
    plugins = npyload.mypy_plugin

or in pyproject.toml::

    [tool.mypy]
    plugins = ["npyload.mypy_plugin"]

Why: ``Loader.__init__`` has overloads so that a loader's type follows what
it yields (``Loader[Batch]``, ``Loader[BatchTuple]`` with ``as_tuple=True``,
``Loader[R]`` for a ``transform=`` returning ``R``). When no overload
accepts a call, mypy says ``No overload variant of "Loader" matches
argument types ...`` and lists the five long signatures, naming no
argument (python/mypy#16725). pyright names it without any plugin.

What it does, for a call of ``npyload.Loader`` only (a signature hook, run
before mypy checks the call):

1. If mypy's own overload resolution accepts the call, nothing changes: the
   call is checked, and typed, exactly as without the plugin.
2. Otherwise it finds the overload the call means: the first one whose
   ``as_tuple`` and ``transform`` parameters accept the call's (the other
   parameters' types, and their number, set aside). It checks the call
   against that overload with mypy's ordinary reporting, which names each
   wrong argument (``Argument "batch_size" to "Loader" has incompatible
   type "str"; expected "int"``, ``Unexpected keyword argument
   "prefetch_factor" for "Loader"``), and gives mypy's resolution that
   overload with its other parameters relaxed to ``Any``, so no "No
   overload variant" message follows and the call keeps the overload's
   type (``Loader[Batch]`` above, not ``Any``).
3. When ``as_tuple`` and ``transform`` fit no overload together, a
   transform for the other batch type (a function of ``BatchTuple``
   without ``as_tuple=True``, of ``Batch`` with it), the call means the
   overload ``as_tuple`` chooses among those taking a transform: the
   message names ``transform`` and the batch type it must take.
4. Otherwise (``as_tuple="yes"``) the call means the last overload
   (``as_tuple: bool``, ``transform`` taking ``Batch | BatchTuple``): the
   message names them, and the call is ``Loader[Any]``.

Tested with mypy 1.13.0 and 2.4.1 (tests/python/test_typing.py runs it with
the installed one). Beyond the plugin API it uses mypy internals, the ones
mypy's own overload checks use: the checker's ``expr_checker.check_call``,
``msg.filter_errors`` and ``local_type_map``. Where they are missing or
behave differently it fails soft: the call is left to mypy's ordinary
overload check, never a crash. The plugin imports only mypy.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

from mypy.nodes import ARG_STAR, ARG_STAR2, CallExpr
from mypy.plugin import FunctionSigContext, Plugin
from mypy.types import AnyType, CallableType, FunctionLike, NoneType, Overloaded, TypeOfAny
from mypy.types import get_proper_type

LOADER = "npyload._loader.Loader"
# The parameters that choose Loader.__init__'s overload (the batch type).
_CHOOSERS = ("as_tuple", "transform")


def _relaxed(item: CallableType, keep: tuple[str, ...] = _CHOOSERS) -> CallableType:
    """The overload with every parameter but ``keep`` typed Any, and any
    further positional and keyword arguments taken (as Any)."""
    anything = AnyType(TypeOfAny.special_form)
    types = [t if n in keep else anything for t, n in zip(item.arg_types, item.arg_names)]
    kinds, names = list(item.arg_kinds), list(item.arg_names)
    if ARG_STAR not in kinds:  # before the keyword-only ones
        at = next((i for i, k in enumerate(kinds) if k.is_named() or k == ARG_STAR2), len(kinds))
        types.insert(at, anything)
        kinds.insert(at, ARG_STAR)
        names.insert(at, None)
    if ARG_STAR2 not in kinds:
        types.append(anything)
        kinds.append(ARG_STAR2)
        names.append(None)
    return item.copy_modified(arg_types=types, arg_kinds=kinds, arg_names=names)


def _takes_transform(item: CallableType) -> bool:
    """Whether the overload's ``transform`` parameter takes a function
    (not only None)."""
    if "transform" not in item.arg_names:
        return False
    t = get_proper_type(item.arg_types[item.arg_names.index("transform")])
    return not isinstance(t, NoneType)


class _Call:
    """One ``Loader(...)`` call, checked with mypy's own machinery."""

    def __init__(self, ctx: FunctionSigContext) -> None:
        call = ctx.context
        assert isinstance(call, CallExpr)
        self.call = call
        self.api: Any = ctx.api  # mypy's TypeChecker: the internals below are not typed
        self.check_call: Callable[..., Any] = getattr(self.api, "expr_checker").check_call

    @contextlib.contextmanager
    def _types_dropped(self) -> Iterator[None]:
        """Types inferred inside are not kept (mypy's speculative checks
        use the same map: the real check later stores its own)."""
        local = getattr(self.api, "local_type_map", None)
        if local is None:
            yield
            return
        cm = local if hasattr(local, "__enter__") else local()  # mypy < 1.16: a method
        with cm:
            yield

    def _check(self, callee: FunctionLike) -> None:
        self.check_call(callee, self.call.args, self.call.arg_kinds, self.call,
                        self.call.arg_names, callable_name=LOADER)

    def accepts(self, callee: FunctionLike) -> bool:
        """Whether ``callee`` accepts the call (its errors hidden)."""
        try:
            watch = self.api.msg.filter_errors(filter_revealed_type=True)
        except TypeError:  # older mypy: no such filter
            watch = self.api.msg.filter_errors()
        with self._types_dropped(), watch:
            self._check(callee)
        return not watch.has_new_errors()

    def report(self, callee: FunctionLike) -> None:
        """Checks the call against ``callee`` with mypy's ordinary messages."""
        with self._types_dropped():
            self._check(callee)

    def meant(self, items: list[CallableType]) -> Optional[int]:
        """The index of the overload the call means, where mypy accepts no
        overload (the last, Loader's catch-all, where as_tuple= and
        transform= fit none); None where mypy accepts one."""
        if self.accepts(Overloaded(items)):
            return None
        both = next((i for i, item in enumerate(items) if self.accepts(_relaxed(item))), None)
        if both is not None:
            return both
        # A transform for the other batch type: the overload as_tuple=
        # chooses among those that take a transform.
        return next((i for i, item in enumerate(items)
                     if _takes_transform(item) and self.accepts(_relaxed(item, ("as_tuple",)))),
                    len(items) - 1)


class NpyloadPlugin(Plugin):
    """Names the wrong argument of a ``Loader(...)`` call (module docstring)."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        # The hook runs once per overload, in order: the call's choice is
        # found at the first and kept for the others.
        self._memo: tuple[Optional[CallExpr], Optional[int]] = (None, None)

    def get_function_signature_hook(
            self, fullname: str) -> Optional[Callable[[FunctionSigContext], FunctionLike]]:
        return self._loader_signature if fullname == LOADER else None

    def _loader_signature(self, ctx: FunctionSigContext) -> FunctionLike:
        sig = ctx.default_signature
        try:
            return self._named_errors(ctx, sig)
        except Exception:  # mypy's internals differ: its ordinary overload check
            return sig

    def _named_errors(self, ctx: FunctionSigContext, sig: CallableType) -> FunctionLike:
        if not isinstance(ctx.context, CallExpr):
            return sig
        callee = get_proper_type(ctx.api.get_expression_type(ctx.context.callee))
        if not isinstance(callee, Overloaded):
            return sig
        items = callee.items
        index = next((i for i, item in enumerate(items) if item == sig), None)
        if index is None:
            return sig
        call = _Call(ctx)
        if index == 0 or self._memo[0] is not ctx.context:
            self._memo = (ctx.context, call.meant(items))
        if self._memo[1] != index:
            return sig
        call.report(sig)  # mypy's messages, naming the arguments
        fits = call.accepts(_relaxed(sig))  # else the catch-all, for as_tuple=/transform=
        return _relaxed(sig) if fits else _relaxed(sig, keep=())


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point (``plugins = npyload.mypy_plugin``)."""
    return NpyloadPlugin
