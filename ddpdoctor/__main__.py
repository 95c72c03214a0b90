"""`python -m ddpdoctor` is the CLI."""

from ddpdoctor.cli import main

if __name__ == "__main__":
    main()
