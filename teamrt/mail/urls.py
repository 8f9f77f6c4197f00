"""Store locators as text, with no I/O: whether one is a URL, and how teamrt shows one.

Below every store, so that a store's own parser (the Redis locator in `redisstore.keys`) and the
messages that name a team share the one rule for hiding a password.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode

Locator = str | os.PathLike[str]
URL_SCHEMES = ("redis://", "rediss://", "unix://")


def is_url(locator: Locator) -> bool:
    """True if `locator` names a network store rather than a team directory."""
    return isinstance(locator, str) and locator.startswith(URL_SCHEMES)


def redacted(locator: Locator) -> str:
    """`locator` as teamrt shows it (messages, logs, `repr`): a store URL's password, in its
    user part (`redis://user:PASSWORD@host`) or its query (`?password=`), replaced by `***`.
    Every place that prints a locator goes through this one function."""
    text = str(locator)
    if not is_url(locator):
        return text
    scheme, _, rest = text.partition("://")
    rest, hash_mark, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    credentials, at, host = rest.rpartition("@")
    if at and ":" in credentials:
        rest = f"{credentials.split(':', 1)[0]}:***@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in pairs):
        query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    return f"{scheme}://{rest}{question}{query}{hash_mark}{fragment}"
