"""The product's version: written into the databases it creates and the packs it exports, printed by
``kernelsmith --version``. In the foundation, so that every package can read it; setup.py reads it too."""

__version__ = "0.1.0"
