"""teamrt is POSIX-only: inbox files are guarded by `fcntl` advisory locks. Imported first by
the package, so that elsewhere the import fails with a sentence, not a missing module."""

try:
    import fcntl  # noqa: F401
except ImportError:  # pragma: no cover - exercised in a child process with fcntl hidden
    import sys

    raise ImportError(
        f"teamrt runs on POSIX systems only (Linux, macOS, BSD): it locks inbox files with "
        f"fcntl, which this platform ({sys.platform}) does not have; on Windows, use WSL"
    ) from None
