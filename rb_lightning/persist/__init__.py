"""Persistence: a replay buffer to a directory and back, knowing nothing of Lightning.

Dumps (one class per kind of storage), their manifest and checksums, atomic
files, the references a checkpoint keeps to a dump beside it, and the dealing of
per-rank dumps onto another number of ranks. The user-facing names are in
:mod:`rb_lightning.checkpoint`.
"""
