"""The model families, one file each, built from the shared parts in layers.py and positional.py."""
