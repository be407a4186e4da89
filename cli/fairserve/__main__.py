"""``python -m fairserve``: the same entry point as the ``fairserve`` console script."""

from fairserve.commands.app import main

if __name__ == "__main__":
    main()
