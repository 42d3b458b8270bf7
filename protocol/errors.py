"""The error hierarchy: one base class, one subclass per kind of failure.

Each layer may define further subclasses next to the code that raises them; they all derive from
:class:`SwarmError` so a CLI can turn any of them into one clear line.
"""


class SwarmError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(SwarmError):
    """A configuration file or override is invalid; the message names the field and what to change."""


class IdentityError(SwarmError):
    """A key file is missing, unreadable, has unsafe permissions or bad contents."""


class DecodeError(SwarmError):
    """Bytes from a peer are not a well-formed record (size, encoding or schema)."""


class SignatureError(SwarmError):
    """A record's signature does not verify against its sender's public key."""


class TransportError(SwarmError):
    """A transport could not start, publish or fetch (not raised for bad peer data, which is dropped)."""
