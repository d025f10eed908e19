"""zoo's Hydra configs. In a clone they are read from this folder; an installed wheel carries them as the package
`zoo.conf` (setup.py), which Hydra reads as `pkg://zoo.conf` (it needs this file to accept the package)."""
