"""The watcher's checkpoint in Kafka: the compacted watch-state topic, shared by leader-elected replicas.

Why: with one SQLite checkpoint per replica, a new leader resumes from its own stale (or absent) checkpoint. It
then re-lists, which shows only the latest state of every object changed during the handover, and never a
DELETED for an object deleted while the previous leader led, if the new one never knew it. With this store,
every replica's leadership term resumes from the last checkpoint of whichever replica led before: each stream's
watch resumes at that resourceVersion (the apiserver still holds the history, so every intermediate state and
every deletion comes as a watch event), and if it has been compacted meanwhile (410) the re-list is reconciled
against the shared ``known`` set, so vanished objects still become DELETED.

Records (topic ``kafka.topics.watch_state``, one partition, ``cleanup.policy=compact``; every key starts with the
*scope*, the Lease's ``namespace/name``, and a NUL, so that compaction keeps the latest record per entry and two
watcher deployments could share a topic)::

    <scope>\\0version              "1" (CHECKPOINT_VERSION)
    <scope>\\0rv\\0<stream>          the stream's resourceVersion; a tombstone when it must list first
    <scope>\\0obj\\0<stream>\\0<uid>  JSON string of the resourceVersion, "\\n", the slimmed object's JSON;
                                   a tombstone once the stream forgot the object (deleted, evicted)
    <scope>\\0held                 {"chunks": n, "bytes": b, "sha256": h} of the held records
    <scope>\\0held\\0<i>            the i-th slice of the held records as JSON lines ([type, object, source])

Fencing: the store's transactional producer has a transactional id derived from the Lease
(``<watch-state topic>.watcher.<lease namespace>.<lease name>``) and is started by ``load``, at the beginning of
a leadership term, *before* the topic is read: starting it bumps the producer epoch, which fences the previous
leader's producer and makes the broker finish (commit or abort) its last transaction, so the read that follows
sees a complete, committed state (see ``kafka.read_to_end``) and nothing the deposed leader tries afterwards can
land. Every ``save`` is one transaction; a save the broker refuses because a newer producer took the id over
(``ProducerFenced``) raises ``LeadershipLost``, which ends the term like a lost lease, without a final checkpoint.
Any other failure (broker unreachable beyond ``call_timeout_s``) is raised as it is and ends the process, like a
publishing failure: a restarted replica resumes from the last committed checkpoint (delivery is at least once).

Sizes: every record stays below the topic's ``max.message.bytes`` (``kafka.topics.max_message_bytes``, also the
producer's maximum request size) minus ``RECORD_MARGIN``, so that no save can fail for ever on one record:

- the held records (up to ``max_held`` of them, each up to an apiserver object's size) are one byte stream cut
  into slices of that size, whatever the size of one record; they are written only when they changed, with the
  slices beyond the new count tombstoned, all in the save's one transaction;
- a known object whose entry would be larger (a slimmed object of ~1 MiB with the 1 MiB limit Event Hubs
  imposes) is stored as its identity (kind, apiVersion, name, namespace, uid, resourceVersion, labels, owner
  references, creation and deletion timestamps), which is all that resuming needs from it except the content of
  a synthetic DELETED after a 410; with labels dropped too if that is still too large, and not at all beyond
  (logged, counted in ``trimmed``/``skipped``): the stream then forgets it on the next leader's re-list only.

One save is bounded by ``call_timeout_s`` and ``transaction_timeout_ms``; the first save after an initial LIST
carries every object (~2 KB each), so the pair bounds how large a cluster one save can checkpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from tracker import errors
from tracker.settings import KafkaSettings
from tracker.shell import kafka
from tracker.shell.leader import LeadershipLost
from tracker.shell.watch.checkpoint import CHECKPOINT_VERSION, CheckpointError, Entry, Saved, Snapshot

log = structlog.get_logger("tracker.watch_state")

RECORD_MARGIN = 32 * 1024  # key, headers and batch framing, with room to spare
PARTITION = 0


def transactional_id(ks: KafkaSettings, *, lease_namespace: str, lease_name: str) -> str:
    """The watch-state producer's transactional id for a Lease: one per leader-elected watcher deployment."""
    return f"{ks.topics.watch_state_topic}.watcher.{lease_namespace}.{lease_name}"


class KafkaCheckpoint:
    """A ``CheckpointStore`` on the watch-state topic, for one leadership term (``load`` once, then ``save``)."""

    def __init__(self, ks: KafkaSettings, *, scope: str, transactional_id: str, load_timeout_s: float = 300.0
                 ) -> None:
        if not scope or "\0" in scope:
            raise errors.ConfigError(f"a watch-state scope must be non-empty and without NUL, got {scope!r}")
        self.ks = ks
        self.topic = ks.topics.watch_state_topic
        self.tp = TopicPartition(self.topic, PARTITION)
        self.scope = scope
        self.prefix = scope.encode() + b"\0"
        self.transactional_id = transactional_id
        self.load_timeout_s = load_timeout_s
        self.max_record_bytes = ks.topics.max_message_bytes - RECORD_MARGIN
        self.producer: AIOKafkaProducer | None = None
        # what the topic holds for this scope (as loaded, then as saved): only differences are written
        self.versioned = False
        self.rvs: dict[str, str] = {}
        self.held_digest = hashlib.sha256(b"").hexdigest()
        self.held_chunks = 0
        self.trimmed = 0  # object entries stored as their identity only
        self.skipped = 0  # object entries too large even so
        self.saves = 0
        self.failed: BaseException | None = None

    # ------------------------------------------------------------------------------------------ load

    async def load(self) -> Saved:
        """Fence the previous owner of the transactional id, then read this scope's latest state."""
        started = time.monotonic()
        ks = self.ks
        await kafka.verify_topics(ks, ("watch_state",))  # a clear error when `tracker topics create` was not run
        producer = kafka.make_producer(ks, transactional_id=self.transactional_id)
        # start = InitProducerId: bumps the epoch (the previous leader is fenced) and waits until the broker has
        # completed the previous epoch's last transaction, so that the read below sees all of it, or none
        await kafka.start(producer, ks, what=f"watch-state producer {self.transactional_id}")
        self.producer = producer
        consumer = kafka.make_consumer(ks, group_id=None)
        await kafka.start(consumer, ks, what="watch-state reader")
        try:
            latest = await kafka.read_to_end(consumer, self.tp, ks=ks, timeout_s=self.load_timeout_s)
        finally:
            await kafka.stop(consumer, ks, what="watch-state reader")
        try:
            saved = self._decode(latest)
        except CheckpointError:
            raise
        except ValueError as exc:  # a value that does not decode (JSON, UTF-8): stored state unusable
            raise CheckpointError(str(exc)) from exc
        log.info("watch_checkpoint_loaded", topic=self.topic, scope=self.scope, records=len(latest),
                 streams=len(saved.rvs), objects=sum(len(k) for k in saved.known.values()), held=len(saved.held),
                 seconds=round(time.monotonic() - started, 3))
        return saved

    def _decode(self, latest: dict[bytes, bytes | None]) -> Saved:
        saved = Saved()
        head: dict[str, Any] | None = None
        chunks: dict[int, bytes] = {}
        for key, value in latest.items():
            if not key.startswith(self.prefix) or value is None:
                continue
            parts = key[len(self.prefix):].split(b"\0")
            kind = parts[0]
            if kind == b"version":
                if value.decode() != str(CHECKPOINT_VERSION):
                    raise CheckpointError(f"{self.topic}: unsupported watch checkpoint version {value.decode()!r} "
                                     f"for {self.scope}")
                self.versioned = True
            elif kind == b"rv" and len(parts) == 2:
                stream = parts[1].decode()
                saved.rvs[stream] = self.rvs[stream] = value.decode()
            elif kind == b"obj" and len(parts) == 3:
                saved.known.setdefault(parts[1].decode(), {})[parts[2].decode()] = _entry(value)
            elif kind == b"held" and len(parts) == 1:
                head = json.loads(value)
            elif kind == b"held" and len(parts) == 2:
                chunks[int(parts[1])] = value
        if head is not None:
            n = int(head["chunks"])
            blob = b"".join(chunks.get(i, b"") for i in range(n))
            digest = hashlib.sha256(blob).hexdigest()
            self.held_chunks = max(n, max(chunks, default=-1) + 1)
            if digest != head.get("sha256") or len(blob) != head.get("bytes"):
                # cannot happen with transactions (the head and its slices are written together); never guess
                log.warning("watch_checkpoint_held_unreadable", topic=self.topic, scope=self.scope)
            else:
                self.held_digest = digest
                for line in blob.splitlines():
                    etype, obj, source = json.loads(line)
                    saved.held.append((etype, obj, source))
        return saved

    # ------------------------------------------------------------------------------------------ save

    async def save(self, snap: Snapshot) -> None:
        """Write what differs from the stored state in one transaction; ``LeadershipLost`` if fenced."""
        if self.failed is not None:
            raise RuntimeError("a watch-state store whose save failed cannot save again (its term is over)") \
                from self.failed
        records = self._records(snap)
        if not records:
            return
        try:
            await kafka.bounded(self._transaction(records), self.ks.call_timeout_s, what="saving the watch checkpoint")
        except BaseException as exc:
            # the snapshot's increments are gone from the watcher and the stored state is unknown: no more saves
            self.failed = exc
            if isinstance(exc, ProducerFenced):
                log.warning("watch_checkpoint_fenced", topic=self.topic, scope=self.scope,
                            transactional_id=self.transactional_id)
                raise LeadershipLost(f"the watch checkpoint {self.transactional_id} was taken over by a newer "
                                     "leader; this term's saves are refused") from exc
            raise
        self.saves += 1

    async def _transaction(self, records: list[tuple[bytes, bytes | None]]) -> None:
        producer = self.producer
        assert producer is not None, "load first"
        # a transaction that fails is not aborted here: it never becomes visible (read_committed), the store is
        # not used again, and the next leader's fencing aborts it
        await producer.begin_transaction()
        sent = [await producer.send(self.topic, value=value, key=key, partition=PARTITION) for key, value in records]
        # the sends' delivery futures (gather spawns no task for a future)
        errors = [r for r in await asyncio.gather(*sent, return_exceptions=True) if isinstance(r, BaseException)]
        if errors:
            raise errors[0]  # all of them fail alike (fenced, or the producer's fatal error)
        await producer.commit_transaction()

    def _records(self, snap: Snapshot) -> list[tuple[bytes, bytes | None]]:
        """The records that bring the topic from its last saved state to ``snap``; updates the saved state."""
        out: list[tuple[bytes, bytes | None]] = []
        if not self.versioned:
            out.append((self._key(b"version"), str(CHECKPOINT_VERSION).encode()))
            self.versioned = True
        for stream, rv in snap.rvs.items():
            if rv is None and stream in self.rvs:
                del self.rvs[stream]
                out.append((self._key(b"rv", stream.encode()), None))
            elif rv is not None and self.rvs.get(stream) != rv:
                self.rvs[stream] = rv
                out.append((self._key(b"rv", stream.encode()), rv.encode()))
        for stream, changed in snap.changed.items():
            for uid, entry in changed.items():
                key = self._key(b"obj", stream.encode(), uid.encode())
                out.append((key, None if entry is None else self._value(key, stream, uid, entry)))
        out.extend(self._held(snap))
        return out

    def _held(self, snap: Snapshot) -> list[tuple[bytes, bytes | None]]:
        blob = b"".join(json.dumps([etype, obj, source], separators=(",", ":")).encode() + b"\n"
                        for _owner, (etype, obj, source) in snap.held)
        digest = hashlib.sha256(blob).hexdigest()
        if digest == self.held_digest:
            return []
        size = self.max_record_bytes
        chunks = [blob[i:i + size] for i in range(0, len(blob), size)]
        out: list[tuple[bytes, bytes | None]] = [(self._key(b"held", str(i).encode()), c)
                                                  for i, c in enumerate(chunks)]
        out += [(self._key(b"held", str(i).encode()), None) for i in range(len(chunks), self.held_chunks)]
        out.append((self._key(b"held"), json.dumps({"chunks": len(chunks), "bytes": len(blob),
                                                    "sha256": digest}).encode()))
        self.held_digest, self.held_chunks = digest, len(chunks)
        return out

    def _value(self, key: bytes, stream: str, uid: str, entry: Entry) -> bytes | None:
        rv, blob = entry
        head = json.dumps(rv).encode() + b"\n"
        if len(key) + len(head) + len(blob) <= self.max_record_bytes:
            return head + blob
        obj = json.loads(blob)
        for keep_labels in (True, False):
            small = json.dumps(_identity(obj, keep_labels=keep_labels), separators=(",", ":")).encode()
            if len(key) + len(head) + len(small) <= self.max_record_bytes:
                self.trimmed += 1
                log.warning("watch_checkpoint_object_trimmed", stream=stream, uid=uid, bytes=len(blob),
                            max_record_bytes=self.max_record_bytes, labels=keep_labels)
                return head + small
        self.skipped += 1
        log.warning("watch_checkpoint_object_skipped", stream=stream, uid=uid, bytes=len(blob),
                    max_record_bytes=self.max_record_bytes)
        return None  # not stored (a tombstone for any earlier, smaller state)

    def _key(self, *parts: bytes) -> bytes:
        return self.prefix + b"\0".join(parts)

    # ------------------------------------------------------------------------------------------ close

    async def close(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            await kafka.stop(producer, self.ks, what=f"watch-state producer {self.transactional_id}")


def _entry(value: bytes) -> Entry:
    head, _, blob = value.partition(b"\n")
    rv = json.loads(head)
    if not isinstance(rv, str):
        raise CheckpointError(f"not a watch checkpoint entry: {value[:100]!r}")
    return rv, blob


def _identity(obj: dict[str, Any], *, keep_labels: bool) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    fields = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
              "ownerReferences", *(("labels",) if keep_labels else ()))
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in fields if k in meta}}
