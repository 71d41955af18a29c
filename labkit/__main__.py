"""`python -m labkit` runs the same entry point as the `labkit` console script."""

from labkit.cli import main

if __name__ == "__main__":
    main()
