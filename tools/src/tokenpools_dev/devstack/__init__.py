"""Real services for development, tests and CI, started by the project's own code (never mocks)."""
