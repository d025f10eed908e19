"""Architecture components. Every module in this package is imported, so each registers its components:
a new part is a new file here, with no list to edit and no config file (zoo.config.schema generates its node);
what it declares is its kind's protocol in zoo/component.py."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
