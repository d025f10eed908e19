"""zoo's Hydra launcher (hydra/launcher=parallel): a sweep's runs in parallel on this machine, each in its own
process, so a run killed by a signal (the out-of-memory killer's SIGKILL) costs that run only.

Hydra finds launchers only in the `hydra_plugins` namespace package; this one ships with zoo."""
