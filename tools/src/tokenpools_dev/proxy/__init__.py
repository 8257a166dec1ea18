"""Test doubles of what the admission proxy talks to: a fake backend, an in-memory producer, a settable clock."""
