"""Which files the wheel holds; the rest of the metadata is in pyproject.toml.

conf/ stays at the top level (where `python train.py` and the design put it) and also ships inside the wheel as
the package `zoo.conf`, so an installed zoo composes its configs with no clone beside it: Hydra reads it as
`pkg://zoo.conf` (zoo.cli.common.config_dir says which conf/ a command uses). Mapping a folder onto a package
name needs the package list written out, with each config group as a package of its own (else setuptools warns
that their files ride as another package's data), which pyproject's `packages.find` cannot say: the list is
made here instead, so a new subpackage of zoo is still found without editing anything. An editable install maps
zoo.conf onto the clone's conf/ the same way."""

from setuptools import find_namespace_packages, setup

GROUPS = find_namespace_packages("conf", exclude=["*__pycache__"])  # attention, data, hydra.launcher, ...
CONF_PACKAGES = ["zoo.conf", *(f"zoo.conf.{group}" for group in GROUPS)]

setup(
    # hydra_plugins: zoo's launcher (hydra/launcher=parallel) and the schema's ConfigStore entries
    packages=find_namespace_packages(include=["zoo*", "hydra_plugins*"], exclude=["*__pycache__"]) + CONF_PACKAGES,
    package_dir={"zoo.conf": "conf"},
    package_data={
        "zoo": ["data/*.gz", "kernels/*.cpp"],  # kernels/*.cpp: zoo.kernels builds them (python -m zoo.kernels build)
        **{package: ["*.yaml"] for package in CONF_PACKAGES},
    },
)
