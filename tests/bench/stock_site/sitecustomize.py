"""Imported at start-up by every Python process whose PYTHONPATH holds this folder: the top-level modules named in
STOCK_IMAGE_HIDE (comma-separated) cannot be found, as on a stock GPU image that lacks them. Every finder already on
sys.meta_path (the path finder, editable installs' finders) is wrapped, so `import x` raises ModuleNotFoundError
and importlib.util.find_spec("x") returns None: optional imports (transformers' availability checks, DeepSpeed's
`try: import mlflow`) take their absent branch, as they do there. Installed distributions' metadata stays
readable: a library that decided from metadata alone would then fail on import, loudly, not pass."""

import os
import sys

HIDDEN = frozenset(filter(None, os.environ.get("STOCK_IMAGE_HIDE", "").split(",")))


class _Hiding:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)

    def invalidate_caches(self):
        if hasattr(self.inner, "invalidate_caches"):
            self.inner.invalidate_caches()

    def __getattr__(self, attribute):  # find_distributions and anything else a finder offers
        return getattr(self.inner, attribute)


if HIDDEN:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
