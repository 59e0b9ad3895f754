"""Op families; each module registers its ops (kernel, shape inference, grad maker) on import.

Every module in this package is imported here, so adding an op family is adding a file.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
