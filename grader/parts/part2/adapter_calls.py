"""Part 2 worker side: how many tokens each forward call of ``generate`` receives, however
``generate`` reaches forward (``adapter.run_generate``'s record, a hint for check 2.9's
feedback and the timed runs' call check).

The handout asks for forward called once with the prompt and then once per new token; it
does not say how. ``self(...)``, ``self.forward(...)``, ``type(self).forward(self, ...)``,
the class by name and a helper function that does any of these are all forward calls, and
a forward that calls itself (a cache-free path that runs the cached one) is still one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


def tokens_given(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many tokens a forward call received: the last axis of its first positional
    argument, else of ``input_ids=``, else of its first integer tensor given by keyword
    (a student's own name for the ids); -1 when none has a shape."""
    import torch

    given = args[0] if args else kwargs.get("input_ids")
    if given is None:
        ints = (v for v in kwargs.values() if isinstance(v, torch.Tensor))
        given = next((v for v in ints if not v.is_floating_point()), None)
    return int(given.shape[-1]) if hasattr(given, "shape") and given.ndim else -1


@contextlib.contextmanager
def forward_calls(model: Any) -> Iterator[list[int]]:
    """While the block runs, the tokens each outermost forward call of ``model`` receives.

    forward is replaced where attribute lookup finds it, and put back afterwards: on the
    instance where it has one of its own, else on the class that defines it, so a call
    through the class counts as one through the instance. Calls made while one is running
    are part of it; calls on other instances of the class pass through uncounted."""
    lengths: list[int] = []
    depth = [0]

    def counted(call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if depth[0] == 0:
            lengths.append(tokens_given(args, kwargs))
        depth[0] += 1
        try:
            return call(*args, **kwargs)
        finally:
            depth[0] -= 1

    if "forward" in vars(model):  # an instance attribute shadows the class's forward
        own = vars(model)["forward"]
        model.forward = functools.wraps(own)(lambda *args, **kwargs: counted(own, args, kwargs))
        try:
            yield lengths
        finally:
            model.forward = own
        return
    owner = next(c for c in type(model).__mro__ if "forward" in vars(c))
    original = vars(owner)["forward"]

    @functools.wraps(original)  # its name, signature and docstring, for code that asks
    def on_class(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is not model:
            return original(self, *args, **kwargs)
        return counted(lambda *a, **k: original(self, *a, **k), args, kwargs)

    owner.forward = on_class
    try:
        yield lengths
    finally:
        owner.forward = original
