"""Finding the tensors a submission keeps (worker side): its cache, wherever it lives.

The probes that ask whether the next call reads the cache must reach every tensor that
call can read, however an honest design keeps it: in what forward hands back (a list of
pairs, a dict, a dataclass, nested to any depth), on a layer (an attribute, a buffer, a
parameter list), in a closure (a function, a bound method or a ``functools.partial``
held anywhere the model reaches, or made at prefill time and passed around), in the
cache of an ``lru_cache``, behind a weak reference, in a ``deque``, or among the globals
of the submission's own modules (a helper ``kv_store.py`` with a module-level dict).

One search (:class:`Search`) follows all of those from its roots, each object once (so
a cycle ends it), and stops after :data:`MAX_VISITS` objects; a container with more than
:data:`MAX_ITEMS` items is a table (a tokenizer's), not a cache, and is not entered.
Library modules (torch's, numpy's, the worker's own) are never entered: only modules
loaded from the folder the model's class came from (:func:`own_globals`). What the
search returns includes parameters; the callers leave the weights out by their memory
(:func:`memory_of`), so that noise is never written into the model itself.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

#: A container with more items than this is a table (a tokenizer's), not a cache.
MAX_ITEMS = 4096
#: How many objects one search visits at most (its time and memory stay bounded).
MAX_VISITS = 50_000
#: Values that hold nothing.
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice)
#: Folders whose modules are libraries, never the submission's own.
_LIBRARY_DIRS = ("site-packages", "dist-packages")
#: ``nn.Module``'s own bookkeeping (hooks, flags, its registries), filled on first use.
_MODULE_INTERNAL: set[str] = set()


def memory_of(tensor: Any) -> int | None:
    """Where ``tensor``'s memory starts (None for a tensor without storage: sparse, say)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


def weight_memory(model: Any) -> set[int | None]:
    """The memory of every parameter of ``model``: a tensor that shares it (a transposed
    weight kept for speed) is the model itself, never its cache."""
    return {memory_of(p) for p in model.parameters()}


class Search:
    """Every tensor reachable from the values given to :meth:`tensors`, each object
    visited once across calls (cycles end there) and at most :data:`MAX_VISITS` in all.
    ``own``: the globals dicts of the submission's own modules, whose classes are entered
    when reached (their attributes: a decorator's closure on a method); a module object is
    never entered (the own ones are roots of their own, :func:`reachable`). ``stop``:
    objects never entered (the model's registered modules, each a root of its own).
    ``modules``: whether an ``nn.Module`` reached is entered (not inside what forward
    hands back). An object that cannot be looked into (a property that raises) is passed
    over: the search never fails on what a submission holds."""

    def __init__(
        self, own: tuple[dict[str, Any], ...] = (), stop: tuple[Any, ...] = (), modules: bool = True
    ) -> None:
        self.own_names = {g.get("__name__") for g in own}
        self.seen: set[int] = {id(s) for s in stop}
        self.alive: list[Any] = []  # what was visited stays alive: no id is reused
        self.visits = 0
        self.modules = modules

    def tensors(self, value: Any) -> list[Any]:
        """The tensors reachable from ``value`` not reached before, depth first."""
        import torch

        found, stack = [], [value]
        while stack and self.visits < MAX_VISITS:
            obj = stack.pop()
            if isinstance(obj, _ATOMS) or id(obj) in self.seen:
                continue
            self.seen.add(id(obj))
            self.alive.append(obj)
            self.visits += 1
            if isinstance(obj, torch.Tensor):
                found.append(obj)
                continue
            try:
                items = self.children(obj)
            except Exception:  # an object that resists being looked into holds no cache
                items = []
            if len(items) <= MAX_ITEMS:
                stack.extend(reversed(items))
        return found

    def children(self, obj: Any) -> list[Any]:
        """What ``obj`` holds that the next call may read (see the module's docstring)."""
        import collections
        import types

        import torch

        if isinstance(obj, dict):
            return list(obj.values())
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            return list(obj)
        if isinstance(obj, torch.nn.Module):
            return _module_values(obj) if self.modules else []
        if isinstance(obj, (types.FunctionType, types.MethodType, types.CellType)):
            return _function_values(obj)
        if isinstance(obj, types.ModuleType):  # the own ones are roots of their own
            return []
        if isinstance(obj, type):
            own = obj.__module__ in self.own_names
            return [v for k, v in vars(obj).items() if not k.startswith("__")] if own else []
        return _other_values(obj, self.own_names)


def _module_values(module: Any) -> list[Any]:
    """A module's own attributes, buffers, parameters and submodules (not its bookkeeping:
    hooks, flags), and its class when that is the submission's."""
    own = [v for k, v in vars(module).items() if not _internal(k)]
    parts = (module._buffers, module._parameters, module._modules)
    return [*own, *(v for part in parts for v in part.values()), type(module)]


def _function_values(obj: Any) -> list[Any]:
    """What a function keeps: its closure's cells, its defaults and its attributes
    (``__wrapped__`` among them); a bound method, its function and its object; a cell,
    what it holds (nothing, when it is not yet filled)."""
    import types

    if isinstance(obj, types.CellType):
        try:
            return [obj.cell_contents]
        except ValueError:
            return []
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    return [
        *(obj.__closure__ or ()),
        *(obj.__defaults__ or ()),
        *(obj.__kwdefaults__ or {}).values(),
        *vars(obj).values(),
    ]


def _other_values(obj: Any, own_names: set[Any]) -> list[Any]:
    """What any other object holds: a weak reference, its object; a partial, its function
    and arguments; an ``lru_cache``, the results it keeps (what the garbage collector sees
    it hold); a generator, its frame's locals; a numpy array of objects, its items; an
    object with attributes (a dataclass, a namespace, a ``WeakKeyDictionary``), them and
    its class when that is the submission's."""
    import gc
    import types
    import weakref

    if isinstance(obj, weakref.ref):
        return [obj()]
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values(), *_attributes(obj)]
    if type(obj).__name__ == "_lru_cache_wrapper":
        return [*(r for r in gc.get_referents(obj) if not isinstance(r, type)), *_attributes(obj)]
    if isinstance(obj, types.GeneratorType):
        return list(obj.gi_frame.f_locals.values()) if obj.gi_frame is not None else []
    if type(obj).__module__ == "numpy" and getattr(getattr(obj, "dtype", None), "kind", "") == "O":
        return list(obj.ravel()) if obj.size <= MAX_ITEMS else []
    kind = type(obj)
    return [*_attributes(obj), *([kind] if kind.__module__ in own_names else [])]


def _attributes(obj: Any) -> list[Any]:
    """The values of ``obj``'s ``__dict__`` and ``__slots__`` (none for a C object)."""
    values = list(getattr(obj, "__dict__", {}).values())
    for kind in type(obj).__mro__:
        slots = vars(kind).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                values.append(getattr(obj, name))
    return values


def _is_library(path: Path) -> bool:
    """Whether ``path`` belongs to an installed library or to Python itself."""
    return any(d in path.parts for d in _LIBRARY_DIRS) or any(
        path.is_relative_to(p) for p in _python_prefixes()
    )


@functools.lru_cache(maxsize=1)
def _python_prefixes() -> frozenset[Path]:
    """Where this Python and its environment are installed (never the file system's root:
    a Python installed there would make every folder a library's)."""
    found = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return frozenset(p for p in found if p.parent != p)


@functools.lru_cache(maxsize=8192)
def _under(file: str, root: Path) -> bool:
    """Whether the module file ``file`` lies under ``root`` and is not a library's."""
    path = Path(file).resolve()
    return path.is_relative_to(root) and not _is_library(path)


def own_globals(model: Any) -> list[dict[str, Any]]:
    """The globals of the submission's own modules: the module that defines ``model``'s
    class (found through its functions, even where it was imported under another name or
    left out of ``sys.modules``), and every module whose file lies under the folder that
    module was loaded from (above its package, for ``llama.model``), loaded or imported
    by one of them: a helper module the model file imports. Never a library's (installed,
    or Python's own)."""
    import types

    cls = type(model)
    home = next(
        (f.__globals__ for f in vars(cls).values() if hasattr(f, "__globals__")),
        getattr(sys.modules.get(cls.__module__), "__dict__", None),
    )
    if not isinstance(home, dict) or not isinstance(home.get("__file__"), str):
        return []
    root = Path(home["__file__"]).resolve().parent
    for _ in range(str(home.get("__name__", "")).count(".")):
        root = root.parent
    if _is_library(root):
        return []

    def own(namespace: dict[str, Any]) -> bool:
        file = namespace.get("__file__")
        return isinstance(file, str) and _under(file, root)

    found: dict[int, dict[str, Any]] = {}
    loaded = [vars(m) for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    queue = [home, *loaded]
    while queue:
        namespace = queue.pop(0)
        if id(namespace) in found or not (namespace is home or own(namespace)):
            continue
        found[id(namespace)] = namespace
        queue += [vars(v) for v in list(namespace.values()) if isinstance(v, types.ModuleType)]
    return list(found.values())


def reachable(model: Any) -> dict[str, list[tuple[str, Any]]]:
    """Every tensor ``model`` can read at its next call, each once, by owner: the name of
    the registered module whose own attributes, buffers or parameters lead to it ("" for
    the model itself), or ``module.name`` for a global of the submission's own modules.
    Each tensor comes with the name of the attribute (or global) it was reached through.
    Parameters are among them: callers leave out the weights (:func:`weight_memory`)."""
    modules = dict(model.named_modules())
    own = tuple(own_globals(model))
    search = Search(own, stop=tuple(modules.values()))
    found: dict[str, list[tuple[str, Any]]] = {}
    for name, module in modules.items():
        entries = {k: v for k, v in vars(module).items() if not _internal(k)}
        entries |= {**module._buffers, **module._parameters}
        for key, value in entries.items():
            found.setdefault(name, []).extend((key, t) for t in search.tensors(value))
    for namespace in own:
        label = str(namespace.get("__name__", ""))
        for key, value in namespace.items():
            if not key.startswith("__"):
                found.setdefault(f"{label}.{key}", []).extend(
                    (key, t) for t in search.tensors(value)
                )
    return {owner: held for owner, held in found.items() if held}


def _internal(key: str) -> bool:
    """Whether ``key`` is ``nn.Module``'s bookkeeping (hooks, flags, its registries)."""
    import torch

    if not _MODULE_INTERNAL:
        _MODULE_INTERNAL.update(vars(torch.nn.Module()))
    return key in _MODULE_INTERNAL


def tensors_in(value: Any) -> list[Any]:
    """Every tensor in ``value`` (what forward handed back as its cache), to any depth:
    in its lists, tuples, dicts, deques, dataclasses and other objects, closures and
    weak references; not inside modules (the weights) or tables. Parameters are left
    out."""
    import torch

    found = Search(modules=False).tensors(value)
    return [t for t in found if not isinstance(t, torch.nn.Parameter)]


def held_tensors(model: Any) -> list[Any]:
    """Every tensor ``model`` keeps outside its parameters (:func:`reachable`), each once.
    Parameters, and tensors that share a parameter's memory (a transposed weight kept for
    speed), are the model itself and are left out."""
    import torch

    weights = weight_memory(model)
    return [
        t
        for held in reachable(model).values()
        for _, t in held
        if not isinstance(t, torch.nn.Parameter) and memory_of(t) not in weights
    ]
