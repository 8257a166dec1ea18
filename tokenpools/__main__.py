"""``python -m tokenpools`` is the ``tokenpools`` command."""

from tokenpools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
