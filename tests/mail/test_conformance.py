"""Both stores pass the one conformance suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from teamrt.mail.filestore import FileStore
from teamrt.mail.memory import MemoryStore
from teamrt.testing.conformance import MailboxConformance, StoreHarness


class TestFileStore(MailboxConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        team = tmp_path / "team"

        def write_raw(name: str, data: bytes) -> None:
            fd = os.open(team / "inboxes" / f"{name}.jsonl", os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

        return StoreHarness(lambda: FileStore(team, max_envelope=64 << 10), write_raw)


class TestFileStoreSmallSegments(TestFileStore):
    """The same behaviour when the log rotates every few envelopes."""

    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        team = tmp_path / "team"

        def write_raw(name: str, data: bytes) -> None:
            with open(team / "inboxes" / f"{name}.jsonl", "ab") as f:
                f.write(data)

        return StoreHarness(lambda: FileStore(team, segment_bytes=1024), write_raw)


class TestMemoryStore(MailboxConformance):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        store = MemoryStore("team", max_envelope=64 << 10)
        return StoreHarness(lambda: store, store.write_raw)
