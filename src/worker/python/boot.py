"""Starts the ferrepl driver from the sources the server sent on fd 3.

The server's `python -c BOOTSTRAP` (src/worker/mod.rs) reads one
length-prefixed text from the control socket: this file, then the path and
source of each module of the `ferrepl_driver` package, all separated by NUL
(which Python source cannot contain). It runs this file in a namespace of its
own and calls `boot((socket, reader), {path: source})`. See
ferrepl_driver/__init__.py for why the package is loaded this way.
"""

import importlib
import importlib.machinery
import importlib.util
import sys

# Code objects of the driver carry file names `<ferrepl-driver:PATH>`: a name
# in angle brackets is never looked up on disk (linecache, inspect), and
# tracebacks shown to the agent drop frames whose file starts with this
# (ferrepl_driver/cells.py).
FILE_PREFIX = "<ferrepl-driver:"


class EmbeddedFinder:
    """A meta-path finder and loader over {path: source}: the driver's modules
    are imported from memory, never from the file system (the sandbox hides
    the server's install location from sessions)."""

    def __init__(self, sources):
        self.modules = {}
        for path, source in sources.items():
            name = path[: -len(".py")].replace("/", ".")
            is_package = name.endswith(".__init__")
            if is_package:
                name = name[: -len(".__init__")]
            self.modules[name] = (path, source, is_package)

    def find_spec(self, name, path=None, target=None):
        entry = self.modules.get(name)
        if entry is None:
            return None
        path, _, is_package = entry
        return importlib.machinery.ModuleSpec(name, self, origin=FILE_PREFIX + path + ">", is_package=is_package)

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        source = self.modules[module.__name__][1]
        code = compile(source, module.__spec__.origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)


# Vendored modules are compiled when first used (ferrepl_driver/_vendor).
VENDOR = "ferrepl_driver._vendor."


def load_vendored(name):
    """The vendored module `name`, compiled and registered on first use."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    path, source = sys.modules["ferrepl_driver._vendor"].sources[name]
    spec = importlib.machinery.ModuleSpec(name, None, origin=FILE_PREFIX + path + ">")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(source, spec.origin, "exec", dont_inherit=True), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def boot(ctl, sources):
    finder = EmbeddedFinder(sources)
    # First on the path, so a `ferrepl_driver` in the session's directory
    # cannot shadow it (and no directory is searched for it).
    sys.meta_path.insert(0, finder)
    try:
        # Every module now, so none is ever imported after the finder is gone.
        for name in finder.modules:
            if not name.startswith(VENDOR):
                importlib.import_module(name)
    finally:
        # The session's own imports never pass through the driver's finder.
        sys.meta_path.remove(finder)
    vendor = sys.modules["ferrepl_driver._vendor"]
    vendor.sources = {
        name: entry[:2] for name, entry in finder.modules.items() if name.startswith(VENDOR)
    }
    vendor.load = load_vendored
    from ferrepl_driver.main import main

    main(ctl)
