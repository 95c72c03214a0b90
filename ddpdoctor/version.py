"""ddpdoctor's version (pyproject.toml has the same): a leaf every layer may import, unlike the package face."""

__version__ = "0.1.0"
