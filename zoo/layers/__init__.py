"""Architecture components. Every module in this package is imported, so each registers its components:
a new part is a new file here (plus its conf/<kind>/<name>.yaml), with no list to edit."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
