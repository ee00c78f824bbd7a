"""The users component: SCRAM credentials in the metadata log (Kafka's KIP-554 rules).

Describe and Alter answer both mq's own clients (``mq users``, over the Unix socket, whose
file mode is the local administrator's door) and Kafka clients (``kafka/sasl_wire.py``), and
``credential`` is what SASL checks passwords against. An upsertion carries a SaltedPassword
and its salt and iterations, never a password; the broker keeps StoredKey and ServerKey.

Alter's rules are Kafka's (ControllerApis / ScramControlManager): each user gets one result,
its first error; an empty name or iterations outside 4096..16384 is UNACCEPTABLE_CREDENTIAL,
an unknown mechanism UNSUPPORTED_SASL_MECHANISM, a (user, mechanism) named twice
DUPLICATE_RESOURCE, the deletion of a credential that does not exist RESOURCE_NOT_FOUND; a
user with an error has none of its changes applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mq.broker.apis import Handler
from mq.broker.conns import Conn
from mq.broker.metadata import MetadataStore
from mq.errors import (
    DuplicateResourceError,
    ResourceNotFoundError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from mq.protocol.kafka.sasl import (
    SCRAM_MECHANISMS,
    ScramCredential,
    check_iterations,
    credential_from_salted,
)
from mq.protocol.messages import Api, Request, response

__all__ = ["UserApis"]

_MAX_NAME = 255


class UserApis:
    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.DESCRIBE_USER_SCRAM_CREDENTIALS: self._describe,
                Api.ALTER_USER_SCRAM_CREDENTIALS: self._alter}

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._metadata.scram.get((user, mechanism))

    # --- the operations, shared by both protocols --------------------------------------------
    def describe(self, users: Sequence[str] | None) -> list[list]:
        """``[[user, error_code, error_message, [[mechanism, iterations], ...]], ...]`` for
        ``users`` (None or empty: every user with a credential, sorted)."""
        held: dict[str, list[list]] = {}
        for (user, mechanism), cred in sorted(self._metadata.scram.items()):
            held.setdefault(user, []).append([mechanism, cred.iterations])
        if not users:
            return [[user, 0, None, infos] for user, infos in held.items()]
        out = []
        counts = {u: users.count(u) for u in users}
        for user in dict.fromkeys(users):
            if counts[user] > 1:
                out.append([user, DuplicateResourceError.code,
                            "Cannot describe SCRAM credentials for the same user twice in a "
                            "single request", []])
            elif user not in held:
                out.append([user, ResourceNotFoundError.code,
                            "Attempt to describe a user credential that does not exist", []])
            else:
                out.append([user, 0, None, held[user]])
        return out

    def alter(self, deletions: Sequence[Sequence], upsertions: Sequence[Sequence]
              ) -> list[list]:
        """Apply ``deletions`` ``[[user, mechanism]]`` and ``upsertions`` ``[[user,
        mechanism, iterations, salt, salted_password]]``; ``[[user, error_code,
        error_message]]`` in the order users first appear. Raises ``LogWriteError`` when the
        metadata log cannot record a change."""
        errors: dict[str, tuple[int, str]] = {}
        seen: set[tuple[str, str]] = set()
        changes: list[tuple[str, str, ScramCredential | None]] = []
        for op in [("delete", *d) for d in deletions] + [("upsert", *u) for u in upsertions]:
            kind, user, mechanism = op[0], op[1], op[2]
            errors.setdefault(user, (0, ""))
            if errors[user][0]:
                continue
            try:
                if not user or len(user) > _MAX_NAME:
                    raise UnacceptableCredentialError(
                        f"Username must be 1 to {_MAX_NAME} characters")
                if mechanism not in SCRAM_MECHANISMS:
                    raise UnsupportedSaslMechanismError(f"Unknown SCRAM mechanism {mechanism!r}")
                if (user, mechanism) in seen:
                    raise DuplicateResourceError("A user credential cannot be altered twice "
                                                 "in the same request")
                seen.add((user, mechanism))
                if kind == "delete":
                    if (user, mechanism) not in self._metadata.scram:
                        raise ResourceNotFoundError("Attempt to delete a user credential "
                                                    "that does not exist")
                    changes.append((user, mechanism, None))
                    continue
                iterations, salt, salted = op[3], op[4], op[5]
                try:
                    check_iterations(iterations)
                except ValueError as err:
                    raise UnacceptableCredentialError(str(err)) from err
                if not salt or len(salted) != _digest_size(mechanism):
                    raise UnacceptableCredentialError("the salt is empty or the salted "
                                                      "password has the wrong length")
                changes.append((user, mechanism, credential_from_salted(
                    mechanism, bytes(salted), bytes(salt), iterations)))
            except (UnacceptableCredentialError, UnsupportedSaslMechanismError,
                    DuplicateResourceError, ResourceNotFoundError) as err:
                errors[user] = (err.code, err.message)
        for user, mechanism, cred in changes:
            if not errors[user][0]:
                self._metadata.set_scram(user, mechanism, cred)
        return [[user, code, msg or None] for user, (code, msg) in errors.items()]

    # --- native handlers ----------------------------------------------------------------------
    def _describe(self, conn: Conn, req: Request) -> list:
        return response(req.api, req.request_id, 0, None, self.describe(req["users"]))

    def _alter(self, conn: Conn, req: Request) -> list:
        return response(req.api, req.request_id, 0, None,
                        self.alter(req["deletions"], req["upsertions"]))


def _digest_size(mechanism: str) -> int:
    return 32 if mechanism == "SCRAM-SHA-256" else 64
