"""The ACL apis (CreateAcls, DescribeAcls, DeleteAcls) on the metadata log's bindings.

One component serves both doors: ``mq acls`` over the Unix socket (whoever may connect to the
socket administers the broker, as for every native api) and the Kafka listener's CreateAcls,
DescribeAcls and DeleteAcls (``kafka/acl_apis.py``, which checks the Cluster operation first
and calls these). A change is recorded in the metadata log and fsync'd before the reply
(``MetadataStore.change_acls``), so an acknowledged ACL survives a crash; a failed write
changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mq import errors
from mq.broker.acls import AclBinding, AclFilter, check_binding
from mq.broker.apis import Handler
from mq.broker.conns import Conn
from mq.broker.metadata import MetadataStore
from mq.protocol.messages import Api, Request, response

__all__ = ["AclApis"]

log = logging.getLogger("mq.broker")


class AclApis:
    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.CREATE_ACLS: self.create_acls, Api.DESCRIBE_ACLS: self.describe_acls,
                Api.DELETE_ACLS: self.delete_acls}

    def create_acls(self, conn: Conn, req: Request) -> list:
        """Each binding's result ``[code, message]``: the valid ones are recorded together
        (one fsync), an invalid one is answered INVALID_REQUEST and not recorded."""
        results: list[list] = []
        valid = []
        for fields in req["bindings"]:
            binding = AclBinding.from_list(fields)
            try:
                check_binding(binding)
            except errors.InvalidRequestError as err:
                results.append([err.code, err.message])
                continue
            valid.append(binding)
            results.append([0, None])
        self._metadata.change_acls(add=valid)
        for b in valid:
            log.info("ACL added: %s", b.as_list())
        return response(req.api, req.request_id, 0, None, results)

    def describe_acls(self, conn: Conn, req: Request) -> list:
        found = self.matching(AclFilter.from_list(req["filter"]))
        return response(req.api, req.request_id, 0, None, [b.as_list() for b in found])

    def delete_acls(self, conn: Conn, req: Request) -> list:
        """Per filter ``[code, message, [binding, ...]]``: the bindings it removed (one
        binding matched by two filters is listed under both, as Kafka does)."""
        per_filter = [self.matching(AclFilter.from_list(f)) for f in req["filters"]]
        removed = {b for found in per_filter for b in found}
        self._metadata.change_acls(remove=removed)
        for b in removed:
            log.info("ACL deleted: %s", b.as_list())
        return response(req.api, req.request_id, 0, None,
                        [[0, None, [b.as_list() for b in found]] for found in per_filter])

    def matching(self, acl_filter: AclFilter) -> list[AclBinding]:
        """The bindings ``acl_filter`` matches, in a stable order (type, name, principal)."""
        return sorted((b for b in self._metadata.acls if acl_filter.matches(b)),
                      key=lambda b: (b.resource_type, b.resource_name, b.pattern_type,
                                     b.principal, b.host, b.operation, b.permission))
