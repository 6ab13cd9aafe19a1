"""The version of vpsshop, apart from the package's facade so that core modules can name it without
importing ``vpsshop`` itself (the facade imports the whole public API)."""

__version__ = "1.0.0"
