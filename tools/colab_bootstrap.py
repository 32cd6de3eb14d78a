"""The start of tilelang_tour_colab.py and of the notebook's setup cell: tools/make_colab.py copies this
module's code (without this docstring) in front of the tour's files.

A notebook cell has no file of its own, but the runner starts each section in a worker process,
`python <folder>/tilelang_tour.py --worker ...`, so that a crashing kernel costs one section. So the cell
writes the tour's files into a folder of their own, named by their hash (a re-run finds them there), puts
it first on sys.path and imports the tour from it: everything then works as in a clone of the repository.
"""

import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
import types

_TOUR_FILES = {}


def _tour_file(path, text):
    """One of the tour's files. Its text is written after the opening quotes' line break, hence [1:]."""
    _TOUR_FILES[path] = text[1:]


def _tour_root():
    """~/.cache/tilelang_tour (under $XDG_CACHE_HOME if set), else a folder of this user's under the temp
    folder: its files are imported, so only a folder that this user owns and others cannot write."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    mine = os.path.join(tempfile.gettempdir(), f"tilelang_tour-{os.getuid()}")
    for root in (os.path.join(cache, "tilelang_tour"), mine):
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            info = os.stat(root)
        except OSError:
            continue
        if info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return root
    return tempfile.mkdtemp(prefix="tilelang_tour-")


def _tour_extract(files):
    """Write `files` into their folder and return it. A file whose text differs (written by an earlier
    version, or a lesson edited in the notebook) is written again; the rest are left alone."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    folder = os.path.join(_tour_root(), digest.hexdigest()[:16])
    for path, text in sorted(files.items()):
        target = os.path.join(folder, *path.split("/"))
        try:
            with open(target, encoding="utf-8", newline="") as fh:
                if fh.read() == text:
                    continue
        except (OSError, ValueError):
            os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = f"{target}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(partial, target)  # never a half-written module, even with two notebooks at once
    return folder


def _tour_use(folder, files):
    """`folder` first on sys.path, instead of any other version's, and none of the tour's modules left
    imported from before: the next import reads them from `folder`."""
    root = os.path.dirname(folder)
    sys.path[:] = [p for p in sys.path if not p or os.path.dirname(os.path.abspath(p)) != root]
    sys.path.insert(0, folder)
    tops = {path.split("/")[0].removesuffix(".py") for path in files}
    for name in [name for name in sys.modules if name.split(".")[0] in tops]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _tour_main(folder, files):
    """The runner's `main`, imported from `folder`."""
    _tour_use(folder, files)
    return importlib.import_module("tilelang_tour").main


def _tour_run_script(folder, files):
    """`python tilelang_tour.py ARGS`, exactly: the runner's own __main__ block, which exits with its code."""
    import runpy

    _tour_use(folder, files)
    runpy.run_path(os.path.join(folder, "tilelang_tour.py"), run_name="__main__")


def _tour_ensure_tilelang():
    """In Colab, pip-install tilelang if it is missing (env_check's installer); elsewhere, say how."""
    if importlib.util.find_spec("tilelang") is not None:
        return
    import tourkit

    if "google.colab" not in sys.modules:
        print(f"tilelang is not installed: {tourkit.TILELANG_INSTALL} (or main(['--install']) lets env_check "
              f"install it)", flush=True)
        return
    from sections import env_check

    print("tilelang is not installed; installing it (Colab)", flush=True)
    env_check.install_tilelang(types.SimpleNamespace(log=lambda line: print(line, flush=True)))
    importlib.invalidate_caches()
