"""The `teamrt` command line."""
