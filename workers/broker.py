"""The embedded broker: kombu's filesystem transport, made safe for several processes.

kombu's own filesystem channel creates a message file and only then writes it, and a
consumer may move and read the file in between: it reads an empty payload and the whole
Celery worker dies on a JSONDecodeError (seen in CI). It also "moves" a taken message to
the system temp folder, which is a copy and a delete when that folder is on another
file system, so two consumers could both take it.

Here a message is written under a name no consumer looks at and renamed into place once
complete, and a consumer claims a message by renaming it inside the broker folder (one
atomic rename, one winner). A payload that still cannot be read is set aside beside the
queue, with an error in the log, instead of killing the consumer.

Both the console (`CELERY_BROKER_TRANSPORT`) and the host agent use it for `filesystem://`.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

TRANSPORT = "workers.broker:FilesystemTransport"
MESSAGE_SUFFIX = ".msg"
CLAIMED_SUFFIX = ".claimed"
REJECTED_SUFFIX = ".rejected"

logger = logging.getLogger(__name__)


def _write_atomically(folder: str, name: str, data: bytes) -> None:
    temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.part")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, os.path.join(folder, name))


class FilesystemChannel(filesystem.Channel):
    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}{MESSAGE_SUFFIX}"
        try:
            _write_atomically(self.data_folder_out, name, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add message {name!r} to {self.data_folder_out}") from exc

    def _get(self, queue: str) -> dict:
        wanted = f"{queue}{MESSAGE_SUFFIX}"
        folder = self.data_folder_in
        for name in sorted(os.listdir(folder)):
            if name.partition(".")[2] != wanted:
                continue
            source = os.path.join(folder, name)
            claimed = f"{source}.{uuid.uuid4().hex}{CLAIMED_SUFFIX}"
            try:
                os.rename(source, claimed)
            except FileNotFoundError:
                continue  # another consumer took it first
            try:
                with open(claimed, "rb") as handle:
                    payload = handle.read()
            except OSError as exc:
                raise filesystem.ChannelError(f"Cannot read message {name!r}") from exc
            try:
                message = loads(bytes_to_str(payload))
            except ValueError:
                os.replace(claimed, source + REJECTED_SUFFIX)
                logger.error("broker message %s is not valid JSON (%d bytes): set aside as %s%s",
                             name, len(payload), name, REJECTED_SUFFIX)
                continue
            if self.store_processed:
                os.replace(claimed, os.path.join(self.processed_folder, name))
            else:
                os.remove(claimed)
            return message
        raise Empty()

    def _table_file(self, exchange: str) -> Path:
        """The exchange's table, where kombu keeps it (kombu 5.7 names it with a helper; 5.6 writes it inline)."""
        kombus = getattr(super(), "_exchange_file", None)
        return Path(kombus(exchange)) if kombus else Path(self.control_folder) / f"{exchange}.exchange"

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # kombu truncates a new exchange table before locking it, so a reader can see an
        # empty file: create it complete, then let kombu's locked update add to it.
        table = self._table_file(exchange)
        self.control_folder.mkdir(parents=True, exist_ok=True)
        if not table.exists():
            row = [[routing_key or "", pattern or "", queue or ""]]
            temporary = table.with_name(f".{table.name}.{uuid.uuid4().hex}.part")
            temporary.write_bytes(str_to_bytes(dumps(row)))
            try:
                os.link(temporary, table)  # fails if another process created it meanwhile
                return
            except FileExistsError:
                pass
            finally:
                temporary.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)


class FilesystemTransport(filesystem.Transport):
    Channel = FilesystemChannel
