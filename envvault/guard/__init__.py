"""Guarded installs and the shell hook.

- ``command``: what a command line is (pip, uv pip, uv add/remove/sync, anything else) and which
  environment it would change;
- ``plan``: the tool's own dry run, read into removals, downgrades, upgrades and build swaps;
- ``builds``: same version string, same build? (the wheel's RECORD against the installed one);
- ``protect``: protected names and retention count, per vault and per environment;
- ``provenance``: wheel URL, sha256 and index from pip's report, kept in snapshots;
- ``run``: the guarded run itself (the one module here that runs commands and restores);
- ``retention``: how many automatic snapshots stay; ``hook``: shell code for bash, zsh and fish.

Nothing is imported here, so ``envvault guard`` can start the dry run before the heavier modules load.
"""
