"""The public test kit: the store conformance suite and helpers (requires pytest).

from teamrt.testing.conformance import MailboxConformance, StoreHarness
"""
