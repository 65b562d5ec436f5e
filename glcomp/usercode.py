"""Importing user code for the command line and `glcomp.train`: a model file or module name, a
``MODULE:ATTR`` model, and calls into that code whose exceptions become one-line GlcompErrors
naming the file and line they were raised at.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from glcomp.errors import GlcompError


@contextlib.contextmanager
def _on_path(folder: str) -> Iterator[None]:
    """Put `folder` first on sys.path while user code is imported (as ``python file.py`` would)."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def _user_error(err: BaseException, what: str) -> GlcompError:
    """A one-line error for an exception raised by user code, naming where it was raised."""
    if isinstance(err, GlcompError):
        return err
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = str(err).strip().splitlines()
    detail = f": {text[0]}" if text else ""
    return GlcompError(f"{what} failed: {type(err).__name__}{detail}{where}")


def call_user(fn: Callable[[], Any], what: str) -> Any:
    """Call `fn`; an exception it raises (other than a GlcompError) becomes a one-line GlcompError
    saying that `what` failed, where and why."""
    try:
        return fn()
    except GlcompError:
        raise
    except Exception as err:  # user code may raise anything; report it in one line
        raise _user_error(err, what) from None


def load_source(source: str) -> ModuleType:
    """Import `source`: a path to a .py file, or an importable module name."""
    path = Path(source)
    if source.endswith(".py") or "/" in source or "\\" in source or path.is_file():
        if not path.is_file():
            raise GlcompError(f"{source}: no such file")
        name = "_glcomp_user_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise GlcompError(f"{source}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            with _on_path(str(path.resolve().parent)):
                call_user(lambda: spec.loader.exec_module(module), f"importing {source}")
        except GlcompError:
            sys.modules.pop(name, None)
            raise
        return module
    if not all(part.isidentifier() for part in source.split(".")):
        raise GlcompError(f"{source!r} is neither a .py file nor a module name")
    try:
        with _on_path(str(Path.cwd())):
            return importlib.import_module(source)
    except ModuleNotFoundError as err:
        if err.name and (source == err.name or source.startswith(err.name + ".")):
            msg = f"no module named {source!r} (give a path to a .py file or an importable name)"
            raise GlcompError(msg) from None
        raise _user_error(err, f"importing {source}") from None
    except GlcompError:
        raise
    except Exception as err:  # the module's own code failed
        raise _user_error(err, f"importing {source}") from None


def load_model(target: str) -> Any:
    """Resolve ``MODULE:ATTR`` to a glcomp Module: an instance, or a zero-argument factory's result."""
    from glcomp.nn import Module

    source, sep, attr = target.rpartition(":")
    if not sep or not source or not attr:
        raise GlcompError(f"expected MODULE:ATTR (e.g. model.py:net or mypkg.models:make), got {target!r}")
    module = load_source(source)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = sorted(
                k
                for k, v in vars(module).items()
                if not k.startswith("_") and (isinstance(v, Module) or inspect.isfunction(v))
            )
            hint = f"; it defines {', '.join(found)}" if found else ""
            raise GlcompError(f"{source} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if type(obj).__module__.split(".")[0] == "torch":
        raise GlcompError(f"{target} is a torch {type(obj).__name__}; build the model with glcomp.nn instead")
    if not isinstance(obj, Module) and callable(obj) and not isinstance(obj, type):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise GlcompError(f"{target} needs arguments; give a Module or a zero-argument factory") from None
        except ValueError:
            pass  # no signature available (a builtin): just call it
        obj = call_user(obj, f"calling {target}()")
    elif isinstance(obj, type) and issubclass(obj, Module):
        obj = call_user(obj, f"constructing {target}()")
    if not isinstance(obj, Module):
        raise GlcompError(f"{target} is a {type(obj).__name__}, not a glcomp.nn.Module")
    return obj
