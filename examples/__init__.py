"""The example configurations (YAML): the paper's experiments and more, shipped in the package as data."""
